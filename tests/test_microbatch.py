"""``passes.microbatch_overlap()``: a batch split into two micro-batches whose collectives overlap
the other's compute.

In-process tests use a 1-rank gloo group (real collectives, one rank): the split's structure
(which ops are copied per micro-batch, the collectives' order and stream, where the halves merge),
its results against the unsplit graph, its refusals, and the token rule table. Tests marked
``distributed`` spawn gloo ranks: the reference models (a tensor-parallel MLP stack, an
expert-parallel MoE layer, a transformers Qwen2-MoE block sharded by expert) on 2 and 4 ranks,
inference and training, every rank deciding the same by measuring.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.conftest import slow

import airstream
from airstream.bench.ranks import run_ranks
from airstream.passes.auto.microbatch import UNSPLIT_KEY, MicrobatchSplit
from airstream.passes.auto.token_dims import Mixed, Positions, Rows, Stop, label_nodes
from airstream.runtime.measured import ONE_STREAM, PLACED, MeasuredExecutor
from airstream.torch_internals import functional_collectives

funcol = functional_collectives()

_FAST_RANKS = "tests/test_microbatch.py::test_reference_models_split_alike_on_two_ranks"
_FAST_LOCAL = "tests/test_microbatch.py::test_tp_stack_splits_in_stage_order"
TIMEOUT_S = 300


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _compile(model: Any, pass_: Any = None, measure: Any = False, **kwargs: Any) -> tuple[Any, Any]:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = pass_
    config.stream_config.measure_placement = measure
    backend = airstream.get_backend(config)
    return torch.compile(model, backend=backend, **kwargs), backend


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(scale, 1.0))


def _split_of(backend: Any) -> tuple[Any, MicrobatchSplit]:
    graph = backend.graphs[-1]
    split = graph.graph_module.meta.get(UNSPLIT_KEY)
    assert isinstance(split, MicrobatchSplit), "the pass left the graph unsplit"
    return graph, split


# --- in one process ---------------------------------------------------------------------------


def test_tp_stack_splits_in_stage_order(one_rank: None) -> None:
    from airstream.bench.tp import TPModel

    model = TPModel(2, 32, 0, 1).eval()
    unsplit, _ = _compile(model, dynamic=True)
    split, backend = _compile(model, airstream.passes.microbatch_overlap(), dynamic=True)
    with torch.no_grad():
        for tokens in (8, 13):  # one graph for both: s = s // 2 + (s - s // 2)
            x = torch.randn(tokens, 32)
            _close(split(x), unsplit(x))
    graph, found = _split_of(backend)
    assert len(backend.graphs) == 1 and found.collectives == 2
    nodes = list(graph.graph_module.graph.nodes)
    collectives = [n.name for n in nodes if "all_reduce" in str(n.target)]
    # each layer's collective, micro-batch a's then b's: the order every rank issues
    assert collectives == [
        "all_reduce_mb0",
        "all_reduce_mb1",
        "all_reduce_1_mb0",
        "all_reduce_1_mb1",
    ]
    streams = graph.streams.stream_of
    assert {streams[c] for c in collectives} == {"comm"}
    waits = [n.name for n in nodes if "wait_tensor" in str(n.target)]
    assert {streams[w] for w in waits} == {"comm"}
    # b's first layer runs between a's collective and a's wait
    order = [n.name for n in nodes]
    a_wait = order.index("wait_tensor_mb0")
    assert order.index("all_reduce_mb0") < order.index("mm_mb1") < a_wait
    assert [str(n.target) for n in nodes if n.op == "output"] == ["output"]
    assert found.merged_at == "output"
    assert sum("aten.cat" in str(n.target) for n in nodes) == 1  # one merge, before the output


def test_moe_dispatch_and_combine_are_copied_whole(one_rank: None) -> None:
    from airstream.bench.microbatch_models import EPMoE, ep_moe_reference

    model = EPMoE(16, 32, 4, 2, 0, 1).eval()
    split, backend = _compile(model, airstream.passes.microbatch_overlap(), dynamic=True)
    with torch.no_grad():
        for tokens in (6, 9):
            x = torch.randn(tokens, 16)
            _close(split(x), ep_moe_reference(x, 16, 32, 4, 2))
    graph, found = _split_of(backend)
    targets = [str(n.target) for n in graph.graph_module.graph.nodes]
    for op in ("sort", "index_add", "topk"):
        assert sum(op in t for t in targets) == 2, op  # once per micro-batch
    assert sum("all_to_all_single" in t for t in targets) == 4  # dispatch and combine, each
    exchanges = [n for n in graph.graph_module.graph.nodes if "all_to_all" in str(n.target)]
    splits = [str(n.args[1]) for n in exchanges]
    assert splits[0] != splits[1]  # each micro-batch's own split sizes
    assert found.collectives == 2


def test_default_mode_splits_and_matches(one_rank: None, default_mode: None) -> None:
    """The mode users get on CPU (Inductor segments between the collectives)."""
    from airstream.bench.tp import TPModel

    model = TPModel(1, 16, 0, 1).eval()
    unsplit, _ = _compile(model)
    split, backend = _compile(model, airstream.passes.microbatch_overlap())
    with torch.no_grad():
        x = torch.randn(12, 16)
        _close(split(x), unsplit(x))
    graph, found = _split_of(backend)
    assert graph.mode == "max-autotune" and found.collectives == 1


def test_training_gradients_equal_the_unsplit_graph(one_rank: None) -> None:
    from airstream.bench.microbatch_models import EPMoE

    def step(compiled: Any, model: Any, x: torch.Tensor) -> list[torch.Tensor]:
        x = x.clone().requires_grad_()
        compiled(x).square().sum().backward()
        grads = [x.grad, *(p.grad for p in model.parameters())]
        model.zero_grad()
        return grads

    model = EPMoE(16, 32, 4, 2, 0, 1)
    unsplit, _ = _compile(model, dynamic=True)
    split, backend = _compile(model, airstream.passes.microbatch_overlap(), dynamic=True)
    x = torch.randn(10, 16)
    want = step(unsplit, model, x)
    got = step(split, model, x)
    for g, w in zip(got, want, strict=True):
        _close(g, w)
    kinds = {g.kind for g in backend.graphs if UNSPLIT_KEY in g.graph_module.meta}
    assert kinds == {"forward", "backward"}  # both halves of the step split


def _refusal(fn: Any, *args: Any) -> str:
    compiled, backend = _compile(fn, airstream.passes.microbatch_overlap())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(*args)
    assert not any(UNSPLIT_KEY in g.graph_module.meta for g in backend.graphs)
    said = [str(w.message) for w in caught if "microbatch_overlap" in str(w.message)]
    assert said, "no warning said why the graph was left unsplit"
    return said[0]


def test_refusals_name_the_node_and_why(one_rank: None) -> None:
    group = dist.group.WORLD
    w = torch.randn(8, 8)
    x = torch.randn(6, 8)

    def over_tokens(x: torch.Tensor) -> torch.Tensor:  # a reduction over tokens feeds the sum
        return funcol.all_reduce((x - x.mean(0)) @ w, "sum", group)

    said = _refusal(over_tokens, x)
    assert "all_reduce" in said and "reduces over the tokens" in said and "'mean'" in said

    def capacity(x: torch.Tensor) -> torch.Tensor:  # the top tokens per expert: capacity dropping
        top = torch.topk(x @ w, 3, dim=0).values
        return funcol.all_reduce(top, "sum", group)

    said = _refusal(capacity, x)
    assert "capacity dropping" in said and "topk" in said

    def random(x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(torch.nn.functional.dropout(x @ w, 0.5), "sum", group)

    said = _refusal(random, x)
    assert ("random" in said and "dropout" in said.lower()) or "bernoulli" in said

    def counted(x: torch.Tensor) -> torch.Tensor:  # positions in an expert: a count over tokens
        return funcol.all_reduce(torch.cumsum(x @ w, 0), "sum", group)

    said = _refusal(counted, x)
    assert "counts over the tokens" in said and "cumsum" in said


def test_a_graph_already_on_streams_is_refused(one_rank: None) -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = [
        airstream.passes.overlap_communication(),
        airstream.passes.microbatch_overlap(),
    ]
    config.stream_config.measure_placement = False
    backend = airstream.get_backend(config)
    w = torch.randn(8, 8)
    compiled = torch.compile(
        lambda x: funcol.all_reduce(x @ w, "sum", dist.group.WORLD), backend=backend
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(torch.randn(4, 8))
    said = " ".join(str(w.message) for w in caught)
    assert "places streams already" in said and "post_grad_custom_pre_pass" in said


def test_a_graph_without_collectives_is_left_alone() -> None:
    compiled, backend = _compile(lambda x: x.relu() + 1, airstream.passes.microbatch_overlap())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing to split is not a refusal
        compiled(torch.randn(4, 4))
    assert UNSPLIT_KEY not in backend.graphs[-1].graph_module.meta


def test_token_rule_table() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    tokens, k = 6, 2
    w = torch.randn(8, 4)

    def fn(x: torch.Tensor, w: torch.Tensor) -> Any:
        h = x @ w  # rows
        total = h.sum(0)  # over tokens: mixed
        probs = torch.softmax(h, -1)  # along a token's row: rows
        _, ids = torch.topk(probs, k, -1)  # per token: rows
        flat = ids.reshape(-1)  # k rows per token
        order = torch.argsort(flat)  # a permutation of the micro-batch's rows: positions
        rows = order // k  # positions of tokens
        gathered = h[rows]  # mixed: sorted rows
        back = torch.zeros_like(h).index_add(0, rows, gathered)  # combined at its token: rows
        blocks = x.unsqueeze(0).expand(2, tokens, 8).reshape(2 * tokens, 8)  # one block per rank
        capped = torch.topk(h, 2, dim=0).values  # top tokens: capacity dropping
        return h, total, probs, flat, order, gathered, back, blocks, capped

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(tokens, 8), w)
    x = next(iter(gm.graph.find_nodes(op="placeholder")))
    labels = label_nodes(gm.graph, {x: Rows(0)}, tokens)
    out = next(iter(gm.graph.find_nodes(op="output"))).args[0]
    got = [labels[n] for n in out]
    h, total, probs, flat, order, gathered, back, blocks, capped = got
    assert h == Rows(0) and probs == Rows(0) and back == Rows(0)
    assert isinstance(total, Mixed) and "reduces over the tokens" in total.why
    assert flat == Rows(0, per=k)
    # a sort's indices over the tokens: positions of the micro-batch's rows, standing for the
    # rows of that sort's permutation; divided by k, positions of tokens
    assert isinstance(order, Positions) and order.fine == order.of == (k, 1)
    sort = order.base
    # rows gathered by positions: the micro-batch's rows permuted by that sort
    assert gathered == Rows(0, per=k, by=sort)
    assert blocks == Rows(0, blocks=2)
    assert isinstance(capped, Stop) and "capacity" in capped.why


def test_measuring_decides_on_the_times_the_ranks_agree_on() -> None:
    class Fake:
        _boxed_call = True
        code = ""

        def __call__(self, args: list[Any]) -> int:
            return 0

    seconds = iter([0.0, 1.0] * 100)
    agreed = []

    def agree(measurement: Any) -> None:  # another rank found the placement far slower
        agreed.append(dict(measurement.seconds))
        measurement.seconds[PLACED] = [10.0] * len(measurement.seconds[PLACED])

    measured = MeasuredExecutor(
        {PLACED: Fake(), ONE_STREAM: Fake()}, 2, 0.03, agree=agree, clock=lambda: next(seconds)
    )
    for _ in range(8):
        measured([])
    assert len(agreed) == 1 and measured.measurement is not None
    assert measured.measurement.chosen == ONE_STREAM


# --- gloo ranks ---------------------------------------------------------------------------------


def _tp(rank: int, world: int, train: bool) -> Any:
    from airstream.bench.tp import TPModel

    model = TPModel(2, 32, rank, world)
    return model if train else model.eval()


def _moe(rank: int, world: int, train: bool) -> Any:
    from airstream.bench.microbatch_models import EPMoE

    model = EPMoE(32, 64, 2 * world, 2, rank, world)
    return model if train else model.eval()


def _qwen2_moe(rank: int, world: int, train: bool) -> Any:
    """transformers' Qwen2-MoE block (batched experts, a shared expert), its experts divided
    among the ranks (each rank's others zeroed, the shared one on rank 0) and summed by an
    all_reduce; fed ``[tokens, 1, hidden]``: a decode batch."""
    from transformers import Qwen2MoeConfig
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock

    config = Qwen2MoeConfig(
        hidden_size=32,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
    )
    config._experts_implementation = "batched_mm"
    torch.manual_seed(0)
    block = Qwen2MoeSparseMoeBlock(config)
    with torch.no_grad():
        for p in block.parameters():
            torch.nn.init.normal_(p, std=0.2)
        per = 4 // world
        mine = torch.zeros(4, 1, 1)
        mine[rank * per : (rank + 1) * per] = 1
        block.experts.down_proj.mul_(mine)
        if rank:
            block.shared_expert.down_proj.weight.zero_()

    class Sharded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return funcol.all_reduce(self.block(x.unsqueeze(1)), "sum", dist.group.WORLD)

    return Sharded() if train else Sharded().eval()


_MODELS = {"tp": _tp, "moe": _moe, "qwen2-moe": _qwen2_moe}


def _case(rank: int, world: int, models: tuple[str, ...], train: bool, mode: str) -> Any:
    if mode != "default":
        os.environ["AIRSTREAM_MODE"] = mode
    else:
        os.environ.pop("AIRSTREAM_MODE", None)
    out = {}
    for name in models:
        model = _MODELS[name](rank, world, train)
        unsplit, _ = _compile(model, dynamic=True)
        split, backend = _compile(
            model, airstream.passes.microbatch_overlap(), "auto", dynamic=True
        )
        hidden = 32
        errors, decisions = [], []
        for tokens in (8, 24):
            x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(rank))
            if train:
                grads = []
                for run in (unsplit, split):
                    xi = x.clone().requires_grad_()
                    run(xi).square().sum().backward()
                    grads.append([xi.grad, *(p.grad.clone() for p in model.parameters())])
                    model.zero_grad()
                for g, w in zip(*grads, strict=True):
                    errors.append(float((g - w).abs().max()) / max(float(w.abs().max()), 1.0))
                continue
            with torch.no_grad():
                want = unsplit(x)
                for _ in range(2 * 2 * 8 * 3):  # enough calls for measuring to decide
                    got = split(x)
            errors.append(float((got - want).abs().max()) / max(float(want.abs().max()), 1.0))
            graph = backend.graphs[-1]
            decisions.append(graph.measurement.chosen if graph.measurement else None)
        splits = [g for g in backend.graphs if UNSPLIT_KEY in g.graph_module.meta]
        kinds = sorted(g.kind for g in splits)
        merged = {g.kind: g.graph_module.meta[UNSPLIT_KEY].merged_at for g in splits}
        out[name] = {"errors": errors, "decisions": decisions, "split": kinds, "merged": merged}
    return out


def _run(world: int, *args: Any) -> dict[int, Any]:
    return run_ranks(world, _case, *args, timeout_s=TIMEOUT_S)


def _check(got: dict[int, Any], world: int, models: tuple[str, ...], train: bool) -> None:
    for name in models:
        for rank in range(world):
            figures = got[rank][name]
            assert max(figures["errors"]) < 1e-5, (name, rank, figures)
            assert figures["split"] == (["backward", "forward"] if train else ["inference"])
            if not train:  # split to the end: every collective hidden (blocks of every rank's
                assert figures["merged"] == {"inference": "output"}, (name, figures)  # rows too)
        if not train:  # every rank kept the same candidate for every size
            decisions = {tuple(got[r][name]["decisions"]) for r in range(world)}
            assert len(decisions) == 1 and None not in next(iter(decisions)), decisions


@pytest.mark.distributed
def test_reference_models_split_alike_on_two_ranks() -> None:
    models = ("tp", "moe")
    _check(_run(2, models, False, "reduce-overhead"), 2, models, False)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "world, models, train, mode",
    [
        (4, ("tp", "moe"), False, "reduce-overhead"),
        (2, ("tp", "moe"), True, "reduce-overhead"),
        (2, ("tp", "moe", "qwen2-moe"), False, "default"),
        (2, ("qwen2-moe",), True, "default"),
    ],
    ids=["4-ranks", "training", "default-mode", "qwen2-moe-training"],
)
@slow("gloo ranks compiling several graphs each", _FAST_RANKS)
def test_reference_models_on_gloo_ranks(
    world: int, models: tuple[str, ...], train: bool, mode: str
) -> None:
    _check(_run(world, models, train, mode), world, models, train)


@pytest.fixture
def fake_two_ranks() -> Iterator[None]:
    from airstream import torch_internals

    dist.init_process_group("fake", store=torch_internals.fake_store(), rank=0, world_size=2)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_sequence_parallel_gather_and_scatter_split(fake_two_ranks: None) -> None:
    """Tokens gathered from every rank (blocks of rows, one per rank), a shared matmul, the rows
    summed and scattered back: both collectives run per micro-batch (structure only: a fake
    group's collectives move no data)."""
    group = dist.group.WORLD
    w = torch.randn(8, 8)

    def layer(x: torch.Tensor) -> torch.Tensor:
        gathered = funcol.all_gather_tensor(x, 0, group)  # [2T, 8]: each rank's rows in turn
        return funcol.reduce_scatter_tensor((gathered @ w).relu(), "sum", 0, group) + x

    compiled, backend = _compile(layer, airstream.passes.microbatch_overlap(), dynamic=True)
    assert compiled(torch.randn(6, 8)).shape == (6, 8)
    graph, found = _split_of(backend)
    targets = [str(n.target) for n in graph.graph_module.graph.nodes]
    assert sum("all_gather_into_tensor" in t for t in targets) == 2
    assert sum("reduce_scatter_tensor" in t for t in targets) == 2
    assert found.collectives == 2 and found.merged_at == "output"
