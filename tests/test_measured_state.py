"""A measurement must not change what it measures: no candidate's calls may leave process state
behind that slows the candidate kept.

The op below is vLLM's ``_C::onednn_mm`` in miniature: a per-process cache of "primitives" keyed
by the input's shape, not the thread count, each made for the intra-op threads of its shape's
first call and run on that count for good (oneDNN's brgemm matmul fixes its thread count when
the primitive is made; docs/benchmarks.md, "A measurement that changes what it measures"). A
primitive made for fewer threads than a later call has makes that call slow. The placed
candidate runs its main stream on ``threads_per_stream`` threads; an op declared to need the
caller's threads runs alone with all of them, so whichever candidate runs a shape first, the
primitive is made as the caller would make it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream.compiler import measuring
from airstream.graph import foreign_ops
from airstream.runtime.measured import ONE_STREAM, PLACED, MeasuredExecutor

_primitives: dict[tuple[int, ...], int] = {}  # shape -> the thread count it was made for
_slowed: list[tuple[int, int]] = []  # (made for, the call's threads) of each slowed call


@torch.library.custom_op("airstream_threads::mm", mutates_args=())
def cached_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` through a primitive made for its shape's first call's thread count."""
    threads = torch.get_num_threads()
    made = _primitives.setdefault(tuple(x.shape), threads)
    if made < threads:
        _slowed.append((made, threads))
    time.sleep(0.002 * threads / made)  # a primitive for fewer threads runs slower
    return x @ w


@cached_mm.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("airstream_threads::work", mutates_args=())
def work(x: torch.Tensor) -> torch.Tensor:
    """3 ms of work that leaves the cores to others (a stand-in for a branch worth overlapping)."""
    time.sleep(0.003)
    return x.sin()


@work.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _Block(torch.nn.Module):
    """A side branch (6 ms) beside a main-stream one (3 ms, then the thread-keyed matmul: the
    side stream is still working when it starts)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("side"):
            side = torch.ops.airstream_threads.work(torch.ops.airstream_threads.work(x.cos()))
        main = torch.ops.airstream_threads.mm(torch.ops.airstream_threads.work(x), self.w)
        return main + side


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    _primitives.clear()
    _slowed.clear()
    foreign_ops.declare_shared_state("airstream_threads", None)  # calls may run at once
    try:
        yield
    finally:
        torch.set_num_threads(before)
        foreign_ops.declare_caller_threads("airstream_threads::mm", None)


def _config() -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.stream_config.measure_placement = True
    config.stream_config.measure_calls = 3
    config.stream_config.measure_threads = ()
    # side streams on worker threads, the main stream on the caller's, lowered to
    # threads_per_stream while a side stream works (on an OpenMP team, an op on the main stream
    # runs inside the team's parallel region, where OpenMP reports the caller's count)
    config.stream_config.openmp_team = False
    return config


def _measure(monkeypatch: pytest.MonkeyPatch, one_stream_first: bool) -> tuple[str, set[int]]:
    """Compile the block, call it until measuring decided and a few calls after; the decision
    and the thread counts its primitives were made for."""
    _primitives.clear()
    _slowed.clear()
    monkeypatch.setattr(
        measuring,
        "MeasuredExecutor",
        functools.partial(MeasuredExecutor, one_stream_first=one_stream_first),
    )
    model = _Block()
    compiled, backend = compile_model(model, _config(), fullgraph=True)
    with torch.no_grad():
        for step in range(2 * 2 * 3 + 4):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    measurement = graph_of(backend, "inference").measurement
    assert measurement is not None and measurement.chosen is not None
    assert {k: len(v) for k, v in measurement.seconds.items()} == {ONE_STREAM: 3, PLACED: 3}
    return measurement.chosen, set(_primitives.values())


@pytest.mark.usefixtures("two_threads")
def test_an_op_keeping_state_per_thread_count_leaves_none_that_slows_the_kept_candidate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    foreign_ops.declare_caller_threads(
        "airstream_threads::mm", "it keeps a primitive made for its first call's threads"
    )
    decisions = set()
    for one_stream_first in (False, True):
        chosen, made = _measure(monkeypatch, one_stream_first)
        assert made == {2}, (
            f"a primitive made for {made} threads (one stream first: {one_stream_first})"
        )
        assert _slowed == []
        decisions.add(chosen)
    # the main branch's 3 ms overlap the side one's 6: the placement wins, whichever runs first
    assert decisions == {PLACED}


@pytest.mark.usefixtures("two_threads")
def test_undeclared_the_placed_candidate_makes_the_primitive_for_its_own_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test above can fail: without the declaration, the placement's first call makes the
    primitive for ``threads_per_stream`` (1), and every later call, the kept one's, pays."""
    _, made = _measure(monkeypatch, one_stream_first=False)
    assert made == {1}
    assert _slowed and all(first == 1 for first, _ in _slowed)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.usefixtures("two_threads")
def test_the_placed_candidates_workers_sleep_once_it_is_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another state a candidate leaves: its stream workers live on, idle. They must not wake
    while the kept candidate runs (they took the GIL 50 times a second each; a transformers
    Qwen2-MoE decode measured in its own process ran 0.93-0.95x of one stream for it)."""
    _measure(monkeypatch, one_stream_first=False)
    workers = [t for t in threading.enumerate() if t.name.startswith("airstream-stream-")]
    assert workers, "the placement ran no side stream on a worker"
    tasks = Path("/proc/self/task")

    def sleeps() -> dict[str, int]:
        out = {}
        for worker in workers:
            status = (tasks / str(worker.native_id) / "status").read_text()
            line = next(ln for ln in status.splitlines() if ln.startswith("voluntary_ctxt"))
            out[worker.name] = int(line.split()[1])
        return out

    before = sleeps()
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # the caller busy in Python, holding the GIL
        pass
    woke = {name: n - before[name] for name, n in sleeps().items()}
    assert all(n <= 2 for n in woke.values()), f"idle workers woke in 0.3 s: {woke}"


def test_a_bad_caller_threads_declaration_says_what_is_expected() -> None:
    with pytest.raises(ValueError, match="declare_caller_threads: target must be"):
        airstream.declare_caller_threads("a::b::c")
    with pytest.raises(ValueError, match="reason must be a non-empty string or None"):
        airstream.declare_caller_threads("mylib", "")


def test_vllms_linears_need_the_callers_threads_only_where_vllm_is_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import types

    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    assert not foreign_ops.needs_caller_threads("_C", "onednn_mm")
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    for name in ("onednn_mm", "onednn_scaled_mm"):
        why = foreign_ops.caller_threads_reason("_C", name)
        assert why is not None and "thread count" in why
    assert not foreign_ops.needs_caller_threads("_C", "cpu_fused_moe")
    assert not foreign_ops.needs_caller_threads("aten", "mm")
