"""What airstream knows of other libraries' ops (airstream.graph.foreign_ops): shared state (never
two at once across streams), the caller's threads, their work.

The op below is vLLM's CPU kernels in miniature: it writes ``out`` (an ``out=`` op, reaching the
graph through ``auto_functionalized_v2``) by way of one module-level scratch buffer, with a
pause between filling the buffer and copying it out. Two calls at once read each other's partial
result; airstream, not knowing the op's library, must order them.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import types
from collections.abc import Iterator

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream.graph.foreign_ops import shared_state

_SCRATCH = torch.zeros(64, 64)
_lock = threading.Lock()
_state = {"in_flight": 0, "most": 0}


@torch.library.custom_op("airstream_scratch::mm", mutates_args=("out",))
def scratch_mm(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """``out = x @ w`` through the shared scratch buffer; notes how many calls overlapped."""
    with _lock:
        _state["in_flight"] += 1
        _state["most"] = max(_state["most"], _state["in_flight"])
    try:
        rows = x.shape[0]
        torch.mm(x, w, out=_SCRATCH[:rows])
        time.sleep(0.02)  # another call at once overwrites the buffer here
        out.copy_(_SCRATCH[:rows])
    finally:
        with _lock:
            _state["in_flight"] -= 1


@scratch_mm.register_fake
def _(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    return None


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.empty(x.shape[0], w.shape[1])
    torch.ops.airstream_scratch.mm(out, x, w)
    return out


class _TwoBranches(torch.nn.Module):
    """A shared expert beside the routed one: each a scratch-buffer matmul, on two streams."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(64, 64))
        self.w2 = torch.nn.Parameter(torch.randn(64, 64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("shared_expert"):
            shared = _mm(x.sin(), self.w1).relu()
        routed = _mm(x.cos(), self.w2).relu()
        return shared + routed


def test_an_unknown_librarys_ops_never_run_at_once_and_are_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _TwoBranches()
    x = torch.randn(16, 64)
    with torch.no_grad():
        want = model(x)
        with caplog.at_level(logging.WARNING, logger="airstream"):
            compiled, backend = compile_model(model, fullgraph=True)
            _state["most"] = 0
            for _ in range(3):
                assert_same(compiled(x), want)
    assert _state["most"] == 1  # ordered: never two calls at once
    graph = graph_of(backend, "inference")
    on_side = graph.streams.nodes_on("shared_expert")
    assert any("auto_functionalized" in name for name in on_side), on_side
    shared = [s for s in graph.plan.syncs if s.reason == "shared state"]
    assert shared, [s.reason for s in graph.plan.syncs]
    named = [r.getMessage() for r in caplog.records if "airstream_scratch::mm" in r.getMessage()]
    assert len(named) == 1, named
    assert "airstream.declare_shared_state('airstream_scratch', None)" in named[0]


def test_a_declared_state_orders_only_the_ops_that_share_it() -> None:
    airstream.declare_shared_state("airstream_declared", None)
    assert shared_state("airstream_declared", "anything") is None
    airstream.declare_shared_state("airstream_declared::fused", "one scratch")
    assert shared_state("airstream_declared", "fused") == "one scratch"  # the op's own wins
    assert shared_state("airstream_declared", "other") is None


def test_torchs_ops_and_vllms_cpu_kernels_are_known_without_a_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # _C is vLLM's there
    with caplog.at_level(logging.WARNING, logger="airstream"):
        assert shared_state("aten", "mm") is None
        assert shared_state("_c10d_functional", "all_reduce") is None
        onednn = shared_state("_C", "onednn_mm")
        assert onednn is not None and "ScratchPadManager" in onednn
        assert shared_state("vllm", "unified_attention_with_output") == onednn
    assert not caplog.records


@pytest.mark.parametrize(
    ("target", "state", "says"),
    [
        ("a::b::c", None, "target must be 'namespace' or 'namespace::op'"),
        ("", None, "target must be"),
        ("mylib", "", "state must be a non-empty string or None"),
    ],
)
def test_a_bad_declaration_says_what_is_expected(target: str, state: str | None, says: str) -> None:
    with pytest.raises(ValueError, match="declare_shared_state: " + says):
        airstream.declare_shared_state(target, state)


@torch.library.custom_op("airstream_scratch::attend", mutates_args=("out",))
def attend(out: torch.Tensor, q: torch.Tensor) -> None:
    """An attention stand-in that, like vLLM's CPU attention, insists on the caller's threads."""
    if torch.get_num_threads() != _state.get("caller_threads", torch.get_num_threads()):
        raise RuntimeError(f"Check failed: thread_num == {torch.get_num_threads()}")
    out.copy_(q.softmax(-1))


@attend.register_fake
def _(out: torch.Tensor, q: torch.Tensor) -> None:
    return None


class _AttentionBeside(_TwoBranches):
    """A side-stream branch and, on main, attention that does not read it: only the rule orders
    the two."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("shared_expert"):
            shared = (x.sin() @ self.w1).relu()
        out = torch.empty_like(x)
        torch.ops.airstream_scratch.attend(out, x.cos())
        return shared + out @ self.w2


@pytest.fixture
def attention_needs_caller_threads() -> Iterator[None]:
    airstream.declare_caller_threads(
        "airstream_scratch::attend", "it checks the thread count its metadata was built for"
    )
    yield
    airstream.declare_caller_threads("airstream_scratch::attend", None)


@pytest.mark.usefixtures("attention_needs_caller_threads")
def test_an_op_needing_the_callers_threads_runs_alone_on_main_with_them() -> None:
    from airstream.runtime.cpu import CpuExecutor

    model = _AttentionBeside()
    x = torch.randn(16, 64)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    _state["caller_threads"] = 2
    try:
        with torch.no_grad():
            want = model(x)
            compiled, backend = compile_model(model, fullgraph=True)
            for _ in range(3):
                assert_same(compiled(x), want)
    finally:
        _state.pop("caller_threads")
        torch.set_num_threads(before)
    graph = graph_of(backend, "inference")
    (attention,) = [n for n in graph.graph_module.graph.nodes if "attend" in str(n.args[:1])]
    assert graph.streams.stream_of[attention.name] is None
    alone = [s for s in graph.plan.syncs if s.reason == "alone"]
    assert alone, [s.reason for s in graph.plan.syncs]
    executor = graph.executor
    assert isinstance(executor, CpuExecutor) and executor.thread_plan.get(attention) is True


@pytest.mark.usefixtures("attention_needs_caller_threads")
def test_an_op_needing_the_callers_threads_on_a_side_stream_is_an_error() -> None:
    class _OnSide(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)
            with airstream.stream("side"):
                torch.ops.airstream_scratch.attend(out, x.sin())
            return out + x

    compiled, _ = compile_model(_OnSide(), fullgraph=True)
    with pytest.raises(Exception, match=r"must run on the main stream.*caller's intra-op threads"):
        with torch.no_grad():
            compiled(torch.randn(4, 8))


class _Attending(torch.nn.Module):
    """A shared expert whose first op needs the caller's threads."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.airstream_scratch.attend(out, x)
        return self.up(out).relu()


class _SharedExpertAttending(torch.nn.Module):
    """That shared expert beside a routed branch."""

    def __init__(self) -> None:
        super().__init__()
        self.shared_expert = _Attending()
        self.routed = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared_expert(x) + self.routed(x).sin()


@pytest.mark.usefixtures("attention_needs_caller_threads")
def test_shared_expert_overlap_leaves_an_op_needing_the_callers_threads_on_main_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = _SharedExpertAttending()
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.shared_expert_overlap()
    config.stream_config.measure_placement = False
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="airstream"), torch.no_grad():
        compiled, backend = compile_model(model, config, fullgraph=True)
        assert_same(compiled(x), model(x))
    assert "shared_expert_overlap: 1 of the" in caplog.text
    assert "airstream_scratch::attend: it checks the thread count" in caplog.text
    graph = graph_of(backend, "inference")
    stream_of = graph.streams.stream_of
    (attention,) = [n for n in graph.graph_module.graph.nodes if "attend" in str(n.args[:1])]
    assert stream_of[attention.name] is None
    assert "shared_expert" in set(stream_of.values())  # the linear still moved


class _AttendingMostly(torch.nn.Module):
    """A shared expert whose work is nearly all in an op needing the caller's threads (as
    vLLM's, whose linears are): what is left is a gate on one column."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.airstream_scratch.attend(out, x)
        return out[:, :1].sigmoid() * 2


class _SharedExpertAttendingMostly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared_expert = _AttendingMostly()
        self.routed = torch.nn.Linear(1024, 1024)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared_expert(x) + self.routed(x).sin()


@pytest.mark.usefixtures("attention_needs_caller_threads")
def test_shared_expert_overlap_places_nothing_where_what_it_could_place_would_not_pay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Left a side stream with a sliver of the shared expert's work, the placement would pay a
    handoff each way for nothing (vLLM's CPU build: 0.40-0.76x of one stream): the whole
    shared expert stays on main, and the warning says why."""
    model = _SharedExpertAttendingMostly()
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.shared_expert_overlap()
    config.stream_config.measure_placement = False
    x = torch.randn(64, 1024)
    with caplog.at_level(logging.WARNING, logger="airstream"), torch.no_grad():
        compiled, backend = compile_model(model, config, fullgraph=True)
        assert_same(compiled(x), model(x))
    assert "would not pay for a side stream's handoffs" in caplog.text, caplog.text
    assert "the whole shared expert stays there" in caplog.text
    graph = graph_of(backend, "inference")
    assert set(graph.streams.stream_of.values()) == {None}


def test_an_extension_named_c_without_vllm_loaded_is_an_unknown_library(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    with caplog.at_level(logging.WARNING, logger="airstream"):
        state = shared_state("_C", "some_kernel_of_another_extension")
    assert state is not None and "ScratchPadManager" not in state
    assert "_C::some_kernel_of_another_extension is not known to airstream" in caplog.text


def test_vllms_matmul_and_fused_moe_have_flops_and_unknown_ops_none() -> None:
    from airstream.graph.foreign_ops import foreign_flops, matmul_input

    a, c = torch.empty(4, 64), torch.empty(4, 128)
    assert foreign_flops("_C", "onednn_mm", {"a": a, "c": c, "bias": None}) == 2 * 4 * 64 * 128
    assert matmul_input("_C", "onednn_mm") == "a" and matmul_input("aten", "mm") is None
    moe = {
        "topk_id": torch.empty(5, 2, dtype=torch.int32),
        "w13": torch.empty(8, 2 * 32, 64),  # experts, 2 x intermediate, hidden
        "w2": torch.empty(8, 64, 32),
    }
    assert foreign_flops("_C", "cpu_fused_moe", moe) == 2 * 5 * 2 * (64 * 64 + 64 * 32)
    assert foreign_flops("_C", "cpu_fused_moe", {}) is None  # arguments it cannot read
    assert foreign_flops("mylib", "fused", {"a": a}) is None


def test_a_functionalized_call_is_read_as_the_op_it_wraps() -> None:
    from airstream.graph.fusion import called_op, multiplies_matrices

    compiled, backend = compile_model(_TwoBranches(), fullgraph=True)
    with torch.no_grad():
        compiled(torch.randn(16, 64))
    gm = graph_of(backend, "inference").graph_module
    calls = [n for n in gm.graph.nodes if "auto_functionalized" in str(n.target)]
    assert calls
    op, args = called_op(calls[0])
    assert op is torch.ops.airstream_scratch.mm.default
    assert set(args) >= {"out", "x", "w"} and isinstance(args["out"], torch.fx.Node)
    assert not multiplies_matrices(calls[0])  # not a matmul airstream knows
