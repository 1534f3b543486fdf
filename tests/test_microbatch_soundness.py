"""``microbatch_overlap`` never changes a result: each class of graph it once split wrongly, or
crashed on, is now split exactly or refused with a warning naming the op (issue 59). In one
process on a one-rank gloo group (real collectives), the split forced (``measure_placement``
off), each result against eager PyTorch; the ranks' agreement on 2 gloo ranks."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import airstream
from airstream.passes.auto.microbatch import REFUSED_KEY, UNSPLIT_KEY, MicrobatchSplit
from airstream.passes.auto.token_dims import Mixed, Positions, Rows, Stop, label_nodes
from airstream.torch_internals import functional_collectives, mark_unbacked

funcol = functional_collectives()


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sum(x: torch.Tensor) -> torch.Tensor:
    return funcol.all_reduce(x, "sum", dist.group.WORLD)


class _Run:
    """A function compiled with the pass forced, called at each token count: its splits, the
    pass's warnings, and every result checked against eager."""

    def __init__(self, fn: Callable[..., Any], dynamic: bool | None, **pass_kw: Any) -> None:
        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = airstream.passes.microbatch_overlap(**pass_kw)
        config.stream_config.measure_placement = False
        self.backend = airstream.get_backend(config)
        self.fn = fn
        self.compiled = torch.compile(fn, backend=self.backend, dynamic=dynamic)
        self.said: list[str] = []

    def __call__(self, *inputs: torch.Tensor) -> _Run:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = self.compiled(*inputs)
        self.said += [str(w.message) for w in caught if "microbatch_overlap" in str(w.message)]
        want = self.fn(*inputs)
        for g, w in zip(_flat(got), _flat(want), strict=True):
            scale = max(float(w.abs().max()), 1.0) if w.numel() else 1.0
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * scale)
        return self

    @property
    def splits(self) -> list[MicrobatchSplit]:
        metas = [g.graph_module.meta for g in self.backend.graphs]
        return [m[UNSPLIT_KEY] for m in metas if UNSPLIT_KEY in m]

    @property
    def refusals(self) -> list[str]:
        metas = [g.graph_module.meta for g in self.backend.graphs]
        return [m[REFUSED_KEY] for m in metas if REFUSED_KEY in m]


def _flat(value: Any) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _tokens(count: int, width: int = 8, seed: int = 0) -> torch.Tensor:
    """``count`` tokens of ``width`` (a count other than the width: a dynamic graph given
    ``[8, 8]`` would take both for one size)."""
    return torch.randn(count, width, generator=torch.Generator().manual_seed(seed))


W = torch.randn(8, 8, generator=torch.Generator().manual_seed(1))


# --- 1. provenance: a scatter makes rows only from its own positions' rows ----------------------


def test_a_scatter_of_a_source_that_mixes_tokens_is_refused(one_rank: None) -> None:
    def centred(x: torch.Tensor) -> torch.Tensor:  # each row minus the mean of every token
        back = torch.zeros_like(x).index_add(0, torch.arange(x.shape[0]), x - x.mean(0))
        return _sum(back @ W)

    run = _Run(centred, dynamic=True)(_tokens(10))(_tokens(7))
    assert not run.splits
    assert "'mean'" in run.said[0] and "reduces over the tokens" in run.said[0]


def test_a_scatter_at_positions_of_another_permutation_is_refused(one_rank: None) -> None:
    def crossed(x: torch.Tensor) -> torch.Tensor:
        first = torch.argsort(x[:, 0], stable=True)
        second = torch.argsort(x[:, 1], stable=True)
        return _sum(torch.zeros_like(x).index_add(0, first, (x[second] @ W).relu()))

    run = _Run(crossed, dynamic=True)(_tokens(10))
    assert not run.splits
    assert "index_add" in run.said[0] and "not those its index positions" in run.said[0]


def test_positions_turned_into_values_make_no_rows(one_rank: None) -> None:
    def collapsed(x: torch.Tensor) -> torch.Tensor:  # every token added into row 0
        ids = torch.zeros_like(torch.arange(x.shape[0]))
        return _sum(torch.zeros_like(x).index_add(0, ids, x @ W))

    run = _Run(collapsed, dynamic=True)(_tokens(10))
    assert not run.splits and run.said


def test_the_moe_combine_by_its_own_sort_splits(one_rank: None) -> None:
    def combine(x: torch.Tensor) -> torch.Tensor:
        order = torch.argsort(x[:, 0], stable=True)
        return _sum(torch.zeros_like(x).index_add(0, order, (x[order] @ W).relu()))

    run = _Run(combine, dynamic=True)(_tokens(10))(_tokens(11))
    assert [s.collectives for s in run.splits] == [1]


def _scatter_by_a_small_shared_index(x: torch.Tensor) -> torch.Tensor:
    return _sum(x.scatter_add(1, torch.zeros(2, 8, dtype=torch.long), x * 2))  # rows 0, 1 only


def _sorted_rows_written_into_zeros(x: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(x[:, 0], stable=True)
    buf = torch.slice_scatter(x.new_zeros(x.shape[0], 8), x[order], dim=1)  # holds sorted rows
    return _sum(buf + x)


def _blocks_through_a_zero_product(x: torch.Tensor) -> torch.Tensor:
    blocks = torch.cat([x[None], (x * 2)[None]]).view(2 * x.shape[0], 8)
    product = torch.addmm(blocks[:, :4], x.new_zeros(2 * x.shape[0], 8), W[:, :4])
    return _sum(product + x.reshape(2 * x.shape[0], 4))  # blocks beside rows two per token


def _positions_cast_narrow(x: torch.Tensor) -> torch.Tensor:
    return _sum(x[torch.arange(x.shape[0]).to(torch.int8).long()] * 2)  # wraps past 127


def _an_unread_collective_of_another_tokens_row(x: torch.Tensor) -> torch.Tensor:
    last = x[torch.full((1,), x.shape[0] - 1)]
    dist.all_reduce(last)  # never read: its micro-batch copies would index past their rows
    return _sum(x * 2)


@pytest.mark.parametrize(
    "fn, counts",
    [
        (_scatter_by_a_small_shared_index, (10, 7)),
        (_sorted_rows_written_into_zeros, (10, 7)),
        (_blocks_through_a_zero_product, (10, 7)),
        (_positions_cast_narrow, (200, 201)),
        (_an_unread_collective_of_another_tokens_row, (10, 7)),
    ],
    ids=[
        "scatter-small-index",
        "sorted-into-zeros",
        "blocks-zero-product",
        "positions-int8",
        "unread-collective",
    ],
)
def test_what_a_review_found_is_exact(one_rank: None, fn: Any, counts: tuple[int, ...]) -> None:
    """A reviewer's counterexamples (wrong results without a word, and a crash): each now exact,
    split or not, in a dynamic and a static graph."""
    for dynamic in (True, False):
        run = _Run(fn, dynamic=dynamic)
        for count in counts:
            run(_tokens(count))


def _returned_views(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Outputs that are views (of the input, through a chain of views): AOTAutograd rebuilds
    them from their base's memory, so they must stay views of it."""
    n = x.shape[0]
    part = x.split([4, 12], dim=1)[0]
    chained = part.unsqueeze(0).expand(1, -1, -1).flatten(0, 1)
    summed = funcol.all_reduce(torch.log1p(x.abs()), "sum", dist.group.WORLD)
    return x[:, :n], chained, x.unsqueeze(1).expand(-1, 3, -1), summed


@pytest.mark.parametrize("training", [False, True])
def test_outputs_that_are_views_stay_views(one_rank: None, training: bool) -> None:
    """The fuzzer's failures in 10,000 graphs were of this class: outputs that are views of an
    input (through a chain of views) came back as copies joined from the micro-batches."""
    run = _Run(_returned_views, dynamic=True)
    for count in (11, 8):
        x = _tokens(count, width=16).requires_grad_(training)
        got, want = run.compiled(x), _returned_views(x)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
        if training:
            grads = [
                torch.autograd.grad(sum(o.sum() for o in out), x)[0]
                for out in (run.compiled(x), _returned_views(x))
            ]
            torch.testing.assert_close(*grads)
    assert run.splits


def _square_exchanged(x: torch.Tensor) -> torch.Tensor:
    square = x[:, : x.shape[0]]  # [T, T]: its second size equals the count
    splits = [square.shape[0]]
    moved = funcol.all_to_all_single_autograd(square, splits, splits, dist.group.WORLD)
    return torch.sort(moved, 1)[0]


def test_a_size_read_from_another_dimension_follows_the_count(one_rank: None) -> None:
    """A backward's split sizes read ``sym_size`` of a [T, T] gradient's other dimension: a
    micro-batch's split is made from its own count, not copied from that expression."""
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.microbatch_overlap()
    config.stream_config.measure_placement = False
    backend = airstream.get_backend(config)
    compiled = torch.compile(_square_exchanged, backend=backend, dynamic=True)
    for count in (8, 11):
        grads = []
        for fn in (compiled, _square_exchanged):
            x = _tokens(count, width=16).requires_grad_()
            (fn(x) * torch.arange(float(count)).unsqueeze(1)).sum().backward()
            grads.append(x.grad)
        torch.testing.assert_close(*grads)
    kinds = {g.kind for g in backend.graphs if UNSPLIT_KEY in g.graph_module.meta}
    assert kinds == {"forward", "backward"}


# --- 2. the token count as a value keeps the whole batch's ----------------------------------


def test_the_token_count_as_a_value_is_the_whole_batchs(one_rank: None) -> None:
    def values(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = x.shape[0]
        scaled = x / torch.full_like(x, n)
        counts = torch.full((n, 1), n, dtype=x.dtype)  # n rows (a size), each holding n
        return _sum(scaled @ W + counts), _sum(x[:, :n] * 2)

    run = _Run(values, dynamic=True)(_tokens(10))(_tokens(13))(_tokens(5))
    assert run.splits and run.splits[0].collectives == 2 and run.splits[0].merged_at == "output"


# --- 3. no micro-batch of one token -----------------------------------------------------------


def test_a_squeeze_keeps_the_token_dimension_of_a_small_micro_batch(one_rank: None) -> None:
    def squeezed(x: torch.Tensor) -> torch.Tensor:
        return _sum(x.squeeze() @ W)

    wide = torch.randn(9, 1, 8)
    run = _Run(squeezed, dynamic=True)(wide)(wide[:5])(wide[:2])(wide[:3])
    # 2 and 3 tokens ran unsplit, 5 and 9 split, every result matched, and one graph served
    # them all (no guard on the micro-batches' sizes recompiled it)
    assert len(run.splits) == len(run.backend.graphs) == 1
    static = _Run(squeezed, dynamic=False)(wide[:3])
    assert not static.splits and static.refusals[0].startswith("left alone: 3 token(s)")


@pytest.mark.usefixtures("default_mode")
def test_max_autotune_compiled_at_too_few_tokens_is_refused_not_a_crash(one_rank: None) -> None:
    """Found by the fuzzer in the default mode: a dynamic graph compiled at 2 tokens built its
    segments for micro-batches of 1 token and failed at 5 (``expected size 2==1``)."""

    def layer(x: torch.Tensor) -> torch.Tensor:
        return _sum(torch.relu(x @ W)) + x.sin()

    run = _Run(layer, dynamic=True)(_tokens(2))(_tokens(5))(_tokens(9))
    assert not run.splits
    assert "an example of 2 token(s), fewer than min_tokens=4" in run.refusals[0]
    assert any("at least 4 tokens" in said for said in run.said)


@pytest.mark.usefixtures("default_mode")
def test_max_autotune_compiled_at_enough_tokens_splits_every_larger_count(
    one_rank: None,
) -> None:
    def layer(x: torch.Tensor) -> torch.Tensor:  # not the graph above: AOTAutograd's cache
        return _sum(torch.relu(x @ W)) + x.cos()  # would serve that one, refused, for any hint

    run = _Run(layer, dynamic=True)(_tokens(9))(_tokens(5))(_tokens(3))(_tokens(10))
    assert run.splits, run.refusals
    # a call at 3 tokens recompiles (max-autotune's guard on a micro-batch of 1), unsplit
    assert all("an example of 3 token(s)" in refused for refused in run.refusals)


def test_min_tokens_below_four_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        airstream.passes.microbatch_overlap(min_tokens=2)


# --- 5. rules read their op's schema ----------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        lambda x: F.normalize(x @ W, dim=-1),
        lambda x: (x @ W) * x.norm(dim=-1, keepdim=True),
        lambda x: (x @ W) / torch.linalg.vector_norm(x, 2, dim=1, keepdim=True),
        lambda x: torch.log_softmax(x @ W, -1) + torch.softmax(x, 1),
    ],
    ids=["normalize", "norm-dim", "vector-norm-ord", "softmaxes"],
)
def test_norms_and_softmaxes_split_along_a_tokens_row(one_rank: None, body: Any) -> None:
    run = _Run(lambda x: _sum(body(x)), dynamic=True)(_tokens(10))(_tokens(9))
    assert run.splits and run.splits[0].merged_at == "output"


def test_a_norm_over_the_tokens_is_not_rows(one_rank: None) -> None:
    def over_tokens(x: torch.Tensor) -> torch.Tensor:  # [T, 3, 8]: the norm over dim 0
        return _sum(x.norm(dim=0) + x)

    run = _Run(over_tokens, dynamic=False)(torch.randn(6, 3, 8))
    assert not run.splits and "reduces over the tokens" in run.said[0]


def test_a_training_step_through_softmax_splits_both_graphs(one_rank: None) -> None:
    w = torch.nn.Parameter(W.clone())

    def step(x: torch.Tensor) -> torch.Tensor:
        return _sum(torch.softmax(x @ w, -1) * torch.log_softmax(x, -1))

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.microbatch_overlap()
    config.stream_config.measure_placement = False
    backend = airstream.get_backend(config)
    compiled = torch.compile(step, backend=backend, dynamic=True)
    grads = []
    for run in (compiled, step):
        x = _tokens(10).requires_grad_()
        (run(x) * torch.arange(10.0).unsqueeze(1)).sum().backward()
        grads.append((x.grad, w.grad.clone()))
        w.grad = None
    for got, want in zip(*grads, strict=True):
        torch.testing.assert_close(got, want)
    kinds = {g.kind for g in backend.graphs if UNSPLIT_KEY in g.graph_module.meta}
    assert kinds == {"forward", "backward"}


# --- 6. in-place collectives, as model code calls them ----------------------------------------


def test_in_place_all_reduces_split_every_layer(one_rank: None) -> None:
    weights = [torch.randn(8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]

    def megatron(x: torch.Tensor) -> torch.Tensor:
        for w in weights:
            h = x @ w
            dist.all_reduce(h)  # reaches the graph as copy(h, wait_tensor(all_reduce(h)))
            x = h.relu() + x
        return x

    run = _Run(megatron, dynamic=True)(_tokens(10))(_tokens(12))
    (split,) = run.splits
    assert split.collectives == split.total == 3 and split.merged_at == "output"


def test_in_place_gather_and_scatter_split(one_rank: None) -> None:
    def gathered(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        dist.all_gather_into_tensor(out, (x @ W).relu())
        back = torch.empty_like(x)
        dist.reduce_scatter_tensor(back, out * 2)
        return back + x

    run = _Run(gathered, dynamic=True)(_tokens(10))(_tokens(13))
    (split,) = run.splits
    assert split.collectives == split.total == 2


# --- a split that ends early says where and why -------------------------------------------------


def test_an_early_merge_is_said_once_with_what_stays_exposed(one_rank: None) -> None:
    def early(x: torch.Tensor) -> torch.Tensor:
        h = _sum(x @ W)
        h = h - h.mean(0)  # mixes tokens: the micro-batches merge here
        return _sum(h @ W)

    run = _Run(early, dynamic=True)(_tokens(10))
    (split,) = run.splits
    assert (split.collectives, split.total) == (1, 2)
    (said,) = run.said
    assert "1 of the graph's 2 collectives" in said and "'mean'" in said
    report = str(airstream.explain(early, _tokens(10), compiler_config=_forced()))
    assert "microbatch_overlap: split into 2 micro-batches: 1 of the graph's 2" in report


def _forced() -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.microbatch_overlap()
    config.stream_config.measure_placement = False
    return config


# --- 7. the smaller classes -------------------------------------------------------------------


class _Shared(torch.nn.Module):
    """Parameters of as many rows as the batch has tokens (the same every call: not rows)."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(tokens, 8))
        self.batched = torch.nn.Parameter(torch.randn(tokens, 4, 4))

    def addmm(self, x: torch.Tensor) -> torch.Tensor:
        return _sum(torch.addmm(self.bias, x, W))

    def bmm(self, x: torch.Tensor) -> torch.Tensor:
        return _sum(torch.bmm(x.view(-1, 4, 2) @ torch.ones(2, 4), self.batched).flatten(1))


def test_a_shared_operand_spanning_the_tokens_is_refused_not_a_crash(one_rank: None) -> None:
    shared = _Shared(6)
    with torch.no_grad():
        for fn, why in ((shared.addmm, "spans them"), (shared.bmm, "spans the tokens")):
            run = _Run(fn, dynamic=False)(_tokens(6))
            assert not run.splits and why in run.said[0], run.said


def test_a_static_size_that_is_a_multiple_of_the_count_is_not_rescaled(one_rank: None) -> None:
    def positions(x: torch.Tensor) -> torch.Tensor:  # arange(8) over H, T = 4
        return _sum(x @ torch.ones(8, 8) + torch.arange(8, dtype=x.dtype))

    run = _Run(positions, dynamic=False)(torch.randn(4, 8))
    assert run.splits and run.splits[0].merged_at == "output"


def test_an_unbacked_count_of_none_or_one_token_runs_unsplit(one_rank: None) -> None:
    """Blocks of rows (each token sent to two ranks) gathered and scattered back: the blocks
    merge with their sizes spelt out, and counts of 0 or 1 token never reach the split."""

    def blocks(x: torch.Tensor) -> torch.Tensor:
        sent = x.unsqueeze(0).expand(2, *x.shape).reshape(2 * x.shape[0], 8)
        gathered = funcol.all_gather_tensor(sent @ W, 0, dist.group.WORLD)
        return funcol.reduce_scatter_tensor(gathered, "sum", 0, dist.group.WORLD)

    run = _Run(blocks, dynamic=None)
    for count in (10, 1, 0, 3, 7):
        x = _tokens(count)
        mark_unbacked(x, 0)
        run(x)
    assert [s.collectives for s in run.splits] == [2]


@torch.library.custom_op("airstream_mb_test::scaled", mutates_args=())
def _scaled(x: torch.Tensor) -> torch.Tensor:
    """An op of a library airstream does not know: it may keep state both micro-batches share."""
    return x * 2


@_scaled.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_an_assertion_and_another_librarys_op_are_not_copied_per_micro_batch() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x: torch.Tensor) -> Any:
        torch.ops.aten._assert_async.msg((x.abs() >= 0).all(), "finite")  # impure by torch
        return _scaled(x), x + 1

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(6, 8))
    x = next(iter(gm.graph.find_nodes(op="placeholder")))
    labels = label_nodes(gm.graph, {x: Rows(0)}, 6)
    stops = {n.name: labels[n].why for n in gm.graph.nodes if isinstance(labels[n], Stop)}
    assert any("assert" in name for name in stops), stops
    assert any("another library" in why for why in stops.values()), stops


def test_labels_of_advanced_indexing_and_sums_over_blocks() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(x: torch.Tensor) -> Any:
        table = torch.arange(3)
        apart = x[:, table, :, table]  # [T, 3, 4, 3] -> [3, T, 4]: the indexed dims first
        adjacent = x[:, table, table]  # [T, 3, 4, 3] -> [T, 3, 3]
        blocks = x.unsqueeze(0).expand(2, *x.shape).reshape(2 * x.shape[0], -1)
        summed = blocks.view(2, x.shape[0], -1).sum(0)  # over the blocks: rows again
        return apart, adjacent, blocks, summed

    gm = make_fx(fn, tracing_mode="fake")(torch.randn(6, 3, 4, 3))
    x = next(iter(gm.graph.find_nodes(op="placeholder")))
    labels = label_nodes(gm.graph, {x: Rows(0)}, 6)
    out = next(iter(gm.graph.find_nodes(op="output"))).args[0]
    apart, adjacent, blocks, summed = (labels[n] for n in out)
    assert apart == Rows(1) and adjacent == Rows(0)
    assert blocks == Rows(0, per=1, blocks=2) and summed == Rows(0)
    assert isinstance(Positions("", (1, 1), (1, 1)), Positions)
    assert not isinstance(summed, (Mixed, Stop))


# --- 4. every rank agrees, over the graph's own process group ---------------------------------


def _subgroup_case(rank: int, world: int) -> dict[str, Any]:
    """Ranks 0 and 1 run tensor-parallel graphs on their own group; rank 2 never compiles one
    (a rank of another pipeline stage). First a graph the two would split differently (rank 1's
    min_tokens is above the batch), then one both split, measured: every agreement runs over
    the group {0, 1} alone, or rank 0 and 1 would wait for rank 2 forever."""
    os.environ["AIRSTREAM_MODE"] = "reduce-overhead"
    group = dist.new_group([0, 1])
    out: dict[str, Any] = {}
    if rank < 2:
        w = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))

        def layer(x: torch.Tensor) -> torch.Tensor:
            return funcol.all_reduce((x @ w).relu(), "sum", group) + x

        x = torch.randn(12, 8, generator=torch.Generator().manual_seed(rank))
        for name, min_tokens, measure in (
            ("differ", 4 if rank == 0 else 16, False),
            ("agree", 4, "auto"),
        ):
            config = airstream.CompilerConfig()
            config.post_grad_custom_pre_pass = airstream.passes.microbatch_overlap(
                min_tokens=min_tokens
            )
            config.stream_config.measure_placement = measure
            backend = airstream.get_backend(config)
            compiled = torch.compile(layer, backend=backend, dynamic=False)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(2 * 2 * 8 * 3):  # enough calls for measuring to decide
                    got = compiled(x)
            graph = backend.graphs[-1]
            out[name] = {
                "split": UNSPLIT_KEY in graph.graph_module.meta,
                "said": [str(c.message) for c in caught if "microbatch" in str(c.message)],
                "error": float((got - layer(x)).abs().max()),
                "chosen": graph.measurement.chosen if graph.measurement else None,
            }
    dist.barrier()
    return out


@pytest.mark.distributed
def test_ranks_agree_over_their_own_group_and_refuse_together() -> None:
    from airstream.bench.ranks import run_ranks

    got = run_ranks(3, _subgroup_case)
    assert got[2] == {}
    for rank in (0, 1):
        differ, agree = got[rank]["differ"], got[rank]["agree"]
        assert not differ["split"] and differ["error"] < 1e-5
        assert "did not all reach the same split" in " ".join(differ["said"]), differ
        assert agree["split"] and agree["error"] < 1e-5
    assert got[0]["agree"]["chosen"] == got[1]["agree"]["chosen"] is not None


def test_stack_pad_and_a_per_token_pick_keep_rows(one_rank: None) -> None:
    def rope_and_pick(x: torch.Tensor) -> torch.Tensor:
        half = x.view(x.shape[0], 4, 2)
        rotated = torch.stack([-half[..., 1], half[..., 0]], -1).flatten(1)  # RoPE's rotation
        padded = F.pad(rotated, (0, 2))  # [T, 10]: the hidden dimension padded
        ids = torch.argmax(x, -1)
        picked = padded[torch.arange(x.shape[0]), ids]  # each token's own column
        return _sum(padded[:, :8] @ W + picked.unsqueeze(1))

    run = _Run(rope_and_pick, dynamic=True)(_tokens(10))(_tokens(7))
    assert run.splits and run.splits[0].merged_at == "output"
