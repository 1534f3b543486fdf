"""Values crossing a boundary between compiled steps are read in the layout they were compiled
for: a segment returns each output in the strides its readers (another segment, an aten op, the
caller) expect, and ``wait_tensor`` hands on the layout its value has. Each cause has a test at
the smallest size that showed it, a stream program the fuzzer draws and an attention block
compiled the way users compile it."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from tests.conftest import assert_same, compile_model, graph_of
from torch.fx.experimental.proxy_tensor import make_fx

import airstream
from airstream import passes
from airstream.graph.layouts import dense_order, same_layout
from airstream.graph.nodes import MADE_AFTER_KEY
from airstream.graph.streams import assign_streams
from airstream.ops.library import STREAM_LABEL_KEY
from airstream.runtime.serial import SerialExecutor
from airstream.schedule import fuse as fuse_module
from airstream.schedule.fuse import fuse_streams
from airstream.schedule.plan import build_plan
from airstream.selftest.fuzz import Program, Step, check_program_max_autotune

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)


def test_layouts_compare_only_dimensions_of_more_than_one_element() -> None:
    assert same_layout((2, 1, 3), (3, 3, 1), (3, 99, 1))
    assert not same_layout((2, 3), (3, 1), (1, 2))
    assert dense_order((2, 3, 4), (12, 1, 3)) == [0, 2, 1]
    assert dense_order((4, 4), (0, 1)) is None  # a broadcast row: no fresh tensor has it
    assert dense_order((4, 4), (8, 1)) is None  # gaps


# --- cause 1: a segment handed on its output in the layout Inductor's decomposition left -----
# Inductor decomposes cat(empty, x) into x.clone(), which keeps a transposed x's strides where
# aten's cat (and so the recorded value) is contiguous; before torch 2.15 Inductor ignored the
# output strides airstream asked for, and the next segment, compiled for the recorded layout,
# read a transposed tensor (Inductor's stride check raised) or the caller got other strides.


def test_a_segment_returns_cat_of_an_empty_cache_in_the_layout_aten_gives() -> None:
    program = Program(
        1,
        (
            Step("op", None, "t", (0,)),
            Step("op", None, "cat_empty", (1,)),  # segment main_0: t, cat; returns the cat
            Step("op", "f1", "sin", (2,)),  # segment f1_0, compiled for a contiguous input
        ),
        (2, 3),
    )
    assert check_program_max_autotune(program, runs=1, min_ops=1) == 2


class Attention(torch.nn.Module):
    """Attention as decoder models write it: q/k/v projected and transposed to heads, a KV cache
    grown by cat from empty (DynamicCache's first step), GQA's expand of k and v to the query
    heads, SDPA; the cache is returned."""

    def __init__(self, dim: int = 32, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.k = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = torch.nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], count, self.head_dim).transpose(1, 2)

    def _expand(self, kv: torch.Tensor) -> torch.Tensor:
        b, _, length, d = kv.shape
        groups = self.heads // self.kv_heads
        wide = kv[:, :, None].expand(b, self.kv_heads, groups, length, d)
        return wide.reshape(b, self.heads, length, d)

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = self._heads(self.q(x), self.heads)
        k = torch.cat([past_k, self._heads(self.k(x), self.kv_heads)], dim=-2)
        v = torch.cat([past_v, self._heads(self.v(x), self.kv_heads)], dim=-2)
        out = F.scaled_dot_product_attention(q, self._expand(k), self._expand(v))
        return self.o(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)), k, v


def _kv_on_side(gm: torch.fx.GraphModule, inputs: object, config: object) -> None:
    passes.place_on_stream(gm, passes.select_nodes(gm, module=r"^[kv]$"), "side")


def test_an_attention_block_on_two_streams_matches_eager_in_the_default_mode(
    default_mode: None,
) -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _kv_on_side
    model = Attention().eval()
    compiled, backend = compile_model(model, config)
    x, past = torch.randn(1, 6, 32), torch.zeros(1, 2, 0, 8)
    with torch.no_grad():
        got, want = compiled(x, past, past), model(x, past, past)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    for mine, eager in zip(got, want, strict=True):  # the caches in eager's layout
        assert same_layout(eager.shape, mine.stride(), eager.stride()), mine.stride()
    graph = graph_of(backend, "inference")
    assert graph.mode == "max-autotune"  # what mode="default" is on CPU
    cats = [s for s in graph.segments if any(n.startswith("cat") for n in s.segment.nodes)]
    assert cats and all(s.node is not None for s in cats), "the caches' cats are compiled"
    assert {s.segment.stream for s in graph.segments} >= {None, "side"}
    assert graph.fallbacks == 0


# --- cause 2: wait_tensor handed on its input where its value is a fresh tensor -------------
# wait_tensor(x, dep)'s value is laid out as a fresh tensor like x (its eager kernel clones):
# contiguous where x is a broadcast (GQA's expand). The executors passed x itself on, so a
# segment compiled for the contiguous value read a stride-0 tensor.


def test_wait_tensor_on_a_broadcast_value_hands_on_the_layout_of_its_value() -> None:
    program = Program(
        1,
        (
            Step("op", None, "expand_row", (0,)),  # x[:1].expand(4, 4): strides (0, 1)
            Step("wait_tensor", None, args=(1, 0)),  # its value: contiguous
            Step("op", None, "sin", (2,)),  # a segment compiled for the contiguous value
        ),
        (3,),
    )
    assert check_program_max_autotune(program, runs=1, min_ops=1) == 2


class ExpandedWait(torch.nn.Module):
    """A side stream makes k; main expands it to the query heads and waits on the expansion
    (``airstream.ops.wait_tensor``) before using it."""

    def __init__(self) -> None:
        super().__init__()
        self.k = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("side"):
            k = self.k(x).view(1, 2, 4, 8)
        wide = k[:, :, None].expand(1, 2, 2, 4, 8)
        wide = airstream.ops.wait_tensor(wide, k)
        return (wide.reshape(1, 4, 4, 8) * 2).sin()


def test_wait_tensor_on_gqa_expand_matches_eager_in_the_default_mode(default_mode: None) -> None:
    model = ExpandedWait().eval()
    compiled, backend = compile_model(model)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert graph.mode == "max-autotune" and graph.streams.side_streams == ("side",)
    assert any(s.node is not None and s.segment.stream is None for s in graph.segments)


# --- cause 3: a segment used a size symbol none of its inputs gave Inductor -----------------
# Inductor reads a symbolic int input as the symbol it was made as; where the shape environment
# later found it equal to another (adding arange(n) to x makes n's symbol x's size), the code
# used the other, and a segment reading only n failed at its first call ("name 's77' is not
# defined", T5's relative positions under dynamic shapes).


def _arange_of_a_checked_int(x: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.sin() * 2
    a = torch.arange(n) * 2 + 1  # a segment reading only n
    with airstream.stream("side"):
        w = y.cos() * 3 + a  # n is x.shape[0]
    return a, w


def test_a_segment_is_given_every_size_symbol_its_code_uses(default_mode: None) -> None:
    compiled, backend = compile_model(_arange_of_a_checked_int, dynamic=True)
    for n in (5, 7):
        x = torch.randn(n)
        assert_same(compiled(x, n), _arange_of_a_checked_int(x, n), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    (arange,) = [s for s in graph.segments if any(n.startswith("arange") for n in s.segment.nodes)]
    assert arange.node is not None and graph.fallbacks == 0
    fused = next(n for n in graph.graph_module.graph.nodes if n.name == arange.node)
    symbolic = [a for a in fused.args if isinstance(a.meta.get("val"), torch.SymInt)]
    assert len(symbolic) == 2, "n, and an input giving the symbol n was found equal to"


def _constants_beside_a_side_stream(x: torch.Tensor) -> torch.Tensor:
    torch.ops.air.scope_enter([STREAM_LABEL_KEY], ["side"])
    y = x.sin() * 2
    torch.ops.air.scope_exit()
    made = torch.full((8,), 2.0) * 3  # segment main_0 (full, mul_1): no tensor input
    return y + made


def test_a_segment_without_inputs_compiles_in_a_candidate_built_at_its_first_call() -> None:
    """A segment of constants (DeepSeek's and Qwen2-MoE's scalar_tensor before a wait) found its
    fake mode in the compile's tracing context only; a measured candidate compiled at its first
    call has none, so the segment ran as aten code (a warning, in bench train)."""
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"
    config.debug.strict_max_autotune = True  # a fallback is an error here
    config.stream_config.measure_placement = True
    config.stream_config.measure_threads = (2,)  # the placement again, built at its first call
    config.stream_config.measure_calls = 1
    compiled, backend = compile_model(_constants_beside_a_side_stream, config)
    x = torch.randn(8)
    for _ in range(3 * 2):  # every candidate's turn: each is built and called
        assert_same(compiled(x), _constants_beside_a_side_stream(x), rtol=1e-6, atol=1e-6)
    graph = graph_of(backend, "inference")
    (made,) = [s for s in graph.segments if "full" in s.segment.nodes]
    assert made.node is not None and graph.fallbacks == 0
    assert graph.measurement is not None and graph.measurement.chosen is not None


# --- cause 4: a view a segment returned came back as a compact copy -------------------------
# A segment returning a slice of a value it computes (rotary embedding's halves in a backward
# graph) got it from Inductor as a dense copy of the slice, not the slice with its gaps it was
# recorded as; a segment on another stream, compiled for the gaps, read it (Inductor's stride
# check raised; training on two streams, every torch). Views read after a segment are now made
# after it, as aten views of the value the segment returns.


def _halves(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The segment of Mistral's backward graph that showed it, with a reader on stream side."""
    aten = torch.ops.aten
    m1, m2 = a * b, c * b
    g1 = aten.slice_backward(-m1[..., :8], [1, 2, 12, 16], 3, 8, 16, 1)
    g2 = aten.slice_backward(m1[..., 8:], [1, 2, 12, 16], 3, 0, 8, 1)
    g3 = aten.slice_backward(-m2[..., :8], [1, 2, 12, 16], 3, 8, 16, 1)
    half = m2[..., 8:]  # read on another stream: (1, 2, 12, 8) with m2's strides
    torch.ops.air.scope_enter([STREAM_LABEL_KEY], ["side"])
    z = half * 2 + 1
    torch.ops.air.scope_exit()
    return g1, g2, g3, z


@pytest.mark.parametrize("kind", ["inference", "backward"])
def test_a_view_read_after_its_segment_is_made_after_it(kind: str) -> None:
    args = [
        torch.randn(1, 12, 2, 16).transpose(1, 2),
        torch.randn(1, 1, 12, 16),
        torch.randn(1, 12, 2, 16).transpose(1, 2),
    ]
    gm = make_fx(_halves, tracing_mode="fake")(*args)
    plan = build_plan(gm, assign_streams(gm))
    segments = fuse_streams(gm, plan, graph_kind=kind, min_ops=1, strict=True)
    assert [s.segment.stream for s in segments] == [None, "side"]
    assert all(s.node is not None for s in segments)
    slices = [n for n in gm.graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert len(slices) == 1, "the slice the side stream reads is an aten view after the segment"
    assert_same(SerialExecutor(gm, build_plan(gm, assign_streams(gm)))(list(args)), _halves(*args))


def _split_heads(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-2's attention input: one projection split into q and k (elements with gaps)."""
    q, k = (x * 2).split(8, dim=-1)
    torch.ops.air.scope_enter([STREAM_LABEL_KEY], ["side"])
    kt = k.transpose(0, 1) * 3  # an element of split, read on another stream
    torch.ops.air.scope_exit()
    return q.sin(), kt


def test_an_element_of_a_split_read_after_its_segment_is_made_after_it() -> None:
    x = torch.randn(4, 16)
    gm = make_fx(_split_heads, tracing_mode="fake")(x)
    segments = fuse_streams(
        gm, build_plan(gm, assign_streams(gm)), graph_kind="inference", min_ops=1, strict=True
    )
    assert all(s.node is not None for s in segments)
    made = [n.target for n in gm.graph.nodes if MADE_AFTER_KEY in n.meta]
    assert made.count(torch.ops.aten.split.Tensor) == 1  # once for both elements read after
    assert made.count(operator.getitem) >= 1
    got = SerialExecutor(gm, build_plan(gm, assign_streams(gm)))([x])
    assert_same(got, _split_heads(x), rtol=1e-6, atol=1e-6)


def _gapped(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = torch.cat([x, -x], 1)[:, ::2]  # a view with gaps, returned
    with airstream.stream("side"):
        z = y.sum() * 2
    return y, z


def test_views_made_after_segments_that_all_fall_back_are_planned(
    default_mode: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """views_after edits the graph before Inductor is tried: the graph is planned again even
    when no segment compiled."""

    def failing(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no Inductor for this test")

    monkeypatch.setattr(fuse_module, "_compile", failing)
    compiled, backend = compile_model(_gapped)
    x = torch.randn(4, 4)
    with pytest.warns(RuntimeWarning, match="runs as aten code"):
        got = compiled(x)
    assert_same(got, _gapped(x))
    graph = graph_of(backend, "inference")
    assert graph.fallbacks == len(graph.segments) > 0
    assert any(MADE_AFTER_KEY in n.meta for n in graph.graph_module.graph.nodes)
