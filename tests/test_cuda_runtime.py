"""CUDA runtime, checked two ways.

Without a GPU (the default run): the generated code, the capture-blocker rules, and whole calls
and captures run against a stand-in for CUDA (``tests/cuda_standin.py``) that logs every call and
keeps CUDA's rules on streams, captures and the allocator's capture state. Graphs are traced with
fake CUDA tensors (so the blockers see a CUDA graph) and run on CPU tensors.

On a GPU (``-m cuda``, ``tools/gpu-check``): the same defects, on real streams. A delay kernel
(``torch.cuda._sleep``) in front of a side-stream read makes each race show on every run, and each
race test also shows that it fails with the fix taken out.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of
from tests.cuda_standin import Graph, StandInCuda
from torch.fx.experimental.proxy_tensor import make_fx

import airstream
from airstream.examples.guide import Model, custom_pre_pass
from airstream.graph.streams import assign_streams
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.cuda import CudaExecutor
from airstream.runtime.cuda_api import CudaApi
from airstream.runtime.cuda_graphs import CudaGraphExecutor, capture_blockers, copy_like
from airstream.schedule.plan import build_plan
from airstream.torch_internals import FakeTensorMode

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

air = torch.ops.air
LABEL = "_user_stream_label"
CUDA0, CUDA1 = torch.device("cuda", 0), torch.device("cuda", 1)


# ---- models -----------------------------------------------------------------------------------


def _two_streams(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    air.scope_enter([LABEL, "_user_stream_priority"], ["side", "-1"])
    a = torch.mm(x, w).relu()
    air.scope_exit()
    b = torch.mm(w, x).sigmoid()
    return a + b, a


@torch.library.custom_op("airtest::fails_if_negative", mutates_args=())
def fails_if_negative(x: torch.Tensor) -> torch.Tensor:
    """Raises on a negative element (a model error the runtime must report and survive)."""
    if bool((x < 0).any()):
        raise ValueError("airtest: negative input")
    return x.clone()


@fails_if_negative.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _fails_on_side(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = x.sin()
    air.scope_enter([LABEL], ["side"])
    checked = torch.ops.airtest.fails_if_negative(x) * 2
    air.scope_exit()
    return y + checked, y


def _fake(*shapes: tuple[int, ...], device: torch.device = CUDA0) -> list[torch.Tensor]:
    with FakeTensorMode():
        return [torch.empty(shape, device=device) for shape in shapes]


def _trace(fn: Callable[..., Any], *shapes: tuple[int, ...], device: torch.device = CUDA0) -> Any:
    return make_fx(fn, tracing_mode="fake")(*_fake(*shapes, device=device))


class Replayable(CudaExecutor):
    """A CudaExecutor whose call inside a stand-in capture also records how to replay it:
    recompute the call on the captured tensors and write the captured outputs in place. As on
    CUDA, a capture writes nothing: what the call wrote to its inputs is undone."""

    def __call__(self, args: list[Any]) -> Any:
        api = self.api
        assert isinstance(api, StandInCuda)
        graph = api.capturing_graph()
        saved = list(args)
        ours = graph is not None and graph is not getattr(self, "_user_graph", None)
        before = [a.clone() if ours and isinstance(a, torch.Tensor) else None for a in saved]
        outputs = super().__call__(args)
        for value, old in zip(saved, before, strict=True):
            if old is not None:
                value.copy_(old)
        if ours:
            at = [_unowned(a) if isinstance(a, torch.Tensor) else a for a in saved]
            del saved

            def replay() -> None:
                fresh = CudaExecutor.__call__(self, list(at))
                for out, new in zip(outputs, fresh, strict=True):
                    out.copy_(new)

            graph.replay_fn = replay
        return outputs


def _unowned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s memory, not kept alive by the result: what a captured graph holds of its
    inputs is their address (a forward's handed-over tensors must not be held by the graph)."""
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return tensor.detach().clone()
    raw = (ctypes.c_char * storage.nbytes()).from_address(storage.data_ptr())
    base = torch.frombuffer(raw, dtype=torch.uint8).view(tensor.dtype)
    return base.as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())


def _executor(
    fn: Callable[..., Any],
    *shapes: tuple[int, ...],
    api: CudaApi | None = None,
    device: torch.device = CUDA0,
) -> tuple[Replayable, torch.fx.GraphModule]:
    gm = _trace(fn, *shapes, device=device)
    plan = build_plan(gm, assign_streams(gm))
    return Replayable(gm, plan, device, api=api or StandInCuda()), gm


def _graph_executor(
    fn: Callable[..., Any], *shapes: tuple[int, ...], static: tuple[int, ...] = (), **kw: Any
) -> tuple[CudaGraphExecutor, StandInCuda]:
    inner, gm = _executor(fn, *shapes, **kw)
    executor = CudaGraphExecutor(inner, gm, static=static)
    assert executor.blockers == [], executor.blockers
    assert isinstance(inner.api, StandInCuda)
    return executor, inner.api


def _between(log: list[tuple[Any, ...]], start: str, end: str) -> list[tuple[Any, ...]]:
    first = next(i for i, e in enumerate(log) if e[0] == start)
    last = next(i for i, e in enumerate(log) if e[0] == end and i > first)
    return log[first + 1 : last]


# ---- generated code ---------------------------------------------------------------------------


def test_generated_code_forks_switches_syncs_and_joins() -> None:
    executor, _ = _executor(_two_streams, (4, 4), (4, 4))
    lines = [line.strip() for line in executor.code.splitlines() if line.strip()]
    text = "\n".join(lines)
    assert "_fork(streams, events, 1)" in text  # fork event after the one sync event
    assert "_use(api, streams, 1)" in text and "_use(api, streams, 0)" in text
    assert "_record(streams, 1, events, 0)" in text and "_wait(streams, 0, events, 0)" in text
    # inputs used on the side stream, and side results used on main, are kept for the consumer
    assert text.count("_keep(") >= 3
    order = [i for i, line in enumerate(lines) if "_record(" in line or "_wait(" in line]
    assert "_record" in lines[order[0]], "the record is issued before the wait"


def test_a_stream_that_runs_nothing_is_neither_forked_nor_waited_on() -> None:
    """Forked and never joined, such a stream would make a CUDA graph capture fail."""

    def marks_only(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["idle"])
        token = air.record()  # nothing runs on "idle": the token is a position
        air.scope_exit()
        air.wait([token])
        return x.sin()

    executor, _ = _executor(marks_only, (4,))
    assert "_fork" not in executor.code and "_wait(" not in executor.code
    assert executor._sides_used == [] and "sin" in executor.code


def test_priority_reaches_the_plan_and_the_side_stream() -> None:
    executor, _ = _executor(_two_streams, (4, 4), (4, 4))
    assert executor.plan.priorities == {"side": -1}
    (side,) = executor.side_streams(capturing=False)
    assert side.priority == -1


# ---- a call: order, device and stream, events, errors ------------------------------------------


def test_a_call_issues_in_order_and_leaves_the_callers_device_and_streams() -> None:
    """Defect 3: set_stream switches the device, and the model's device was whatever was
    current. The call runs under a guard for the model's device and restores it all."""
    api = StandInCuda()
    executor, _ = _executor(_two_streams, (4, 4), (4, 4), api=api, device=CUDA1)
    mine = api.new_stream(CUDA1, 0)
    api.set_stream(mine)  # the caller's stream on the model's device
    api.device_now = 0  # and the caller on cuda:0
    before = {0: api.current_stream(CUDA0), 1: api.current_stream(CUDA1)}
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    api.log.clear()
    assert_same(executor([x, w]), _two_streams(x, w))
    assert api.device_now == 0, "the caller's current device is left as it was"
    assert {0: api.current_stream(CUDA0), 1: api.current_stream(CUDA1)} == before
    side = executor.side_streams(capturing=False)[0]
    assert side.device == 1, "side streams live on the model's device"
    log = api.log
    fork = [e for e in log if e[0] in ("record", "wait_event")][:2]
    assert fork[0][:2] == ("record", mine.name) and fork[1][:2] == ("wait_event", side.name)
    uses = [e[1] for e in log if e[0] == "use"]
    assert uses == [side.name, mine.name, mine.name], "to the side, back, restored"
    recorded: set[str] = set()
    for entry in log:
        if entry[0] == "record":
            recorded.add(entry[2])
        elif entry[0] == "wait_event":
            assert entry[2] in recorded, f"{entry} waits for an event not yet recorded"


def test_events_are_made_once_and_reused() -> None:
    """Defect 7: a new event per sync per call."""
    api = StandInCuda()
    executor, _ = _executor(_two_streams, (4, 4), (4, 4), api=api)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    for _ in range(5):
        assert_same(executor([x, w]), _two_streams(x, w))
    assert len(api.calls("new_event")) == executor._num_events == 2


def test_an_error_on_a_side_stream_joins_restores_and_names_the_node() -> None:
    """Defect 6: an exception mid-call skipped the join, so side-stream work could still be
    reading the caller's tensors when the caller wrote them."""
    api = StandInCuda()
    executor, _ = _executor(_fails_on_side, (8,), api=api)
    caller = api.current_stream(CUDA0)
    api.log.clear()
    with pytest.raises(ValueError, match="negative input") as raised:
        executor([-torch.ones(8)])
    (side,) = executor.side_streams(capturing=False)
    assert ("wait_stream", caller.name, side.name) in api.log, "the caller waits for the side"
    assert api.current_stream(CUDA0) is caller and api.device_now == 0
    notes = " ".join(getattr(raised.value, "__notes__", []))
    assert "fails_if_negative" in notes and "'side'" in notes, notes
    x = torch.rand(8)
    assert_same(executor([x]), _fails_on_side(x))  # the next call works


def test_more_labels_than_the_stream_pool_warns_and_names_who_shares() -> None:
    """Defect 7: torch's pool has 32 streams per priority; more labels silently shared them."""

    def three(x: torch.Tensor) -> torch.Tensor:
        outs = []
        for label in ("a", "b", "c"):
            air.scope_enter([LABEL], [label])
            outs.append(x.sin() + len(label))
            air.scope_exit()
        return outs[0] + outs[1] + outs[2]

    api = StandInCuda(pool_size=2)
    executor, _ = _executor(three, (4,), api=api)
    with pytest.warns(
        UserWarning, match=r"more than 2 CUDA streams .*label 'c' shares with label 'a'"
    ):
        executor([torch.randn(4)])


# ---- capture ----------------------------------------------------------------------------------


def _reuse(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``a`` is made on main and last read on the side; main's next allocation (``b``, same size)
    takes its memory unless record_stream holds it."""
    a = x * 2
    air.scope_enter([LABEL], ["side"])
    s = a.cos()
    air.scope_exit()
    b = x * 3
    return s, b + 1


def test_capture_keeps_memory_read_on_other_streams() -> None:
    """Defect 1: the capture ran without record_stream, and the generated code frees a value
    after its last use, so main's next allocation could take memory a side kernel still reads."""
    executor, api = _graph_executor(_reuse, (64,))
    x = torch.randn(64)
    assert_same(executor([x]), _reuse(x))
    in_capture = _between(api.log, "capture_begin", "capture_end")
    kept = [e for e in in_capture if e[0] == "keep"]
    assert kept and all(e[3] for e in kept), "record_stream is called inside the capture"
    warm = api.log[: api.log.index(next(e for e in api.log if e[0] == "capture_begin"))]
    per_call = len([e for e in warm if e[0] == "keep"]) // executor.warmup
    assert len(kept) == per_call, "every value a stream call keeps is kept in the capture too"
    # the code frees `a` after the side read is issued, before main allocates `b`
    code = executor.inner.code
    assert code.index("cos = ") < code.index("mul_1 = ")
    assert code.index("mul = None") < code.index("mul_1 = ")


def test_replays_read_new_inputs_and_weights_in_place_and_return_fresh_outputs() -> None:
    executor, api = _graph_executor(_two_streams, (6, 6), (6, 6), static=(1,))
    x, w = torch.randn(6, 6), torch.randn(6, 6)
    args = [x, w]
    first = executor(args)
    assert args == [], "the boxed convention: the argument list is emptied"
    assert_same(first, _two_streams(x, w))
    assert executor.captures == 1 and len(api.calls("capture_begin")) == 1
    assert executor._inputs[1] is w, "the weight is captured by address, not copied"
    assert executor._inputs[0] is not x, "the input is copied into the graph's own buffer"
    keep = first[0].clone()
    x2 = torch.randn(6, 6)
    second = executor([x2, w])
    assert_same(second, _two_streams(x2, w))
    assert_same(first[0], keep), "a replay does not overwrite an earlier result"
    assert len(api.calls("replay")) == 2 and len(api.calls("capture_begin")) == 1
    with torch.no_grad():
        w.add_(1.0)  # updated in place (an optimizer step): the replay reads the new values
    assert_same(executor([x2, w]), _two_streams(x2, w))
    w_new = torch.randn(6, 6)  # a different tensor (load_state_dict with assign=True)
    assert_same(executor([x2, w_new]), _two_streams(x2, w_new))
    assert executor.captures == 2 and executor._inputs[1] is w_new


def _returns_weight(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    air.scope_enter([LABEL], ["side"])
    a = torch.mm(x, w).relu()
    air.scope_exit()
    return a, w.t()  # a view of the weight: eager returns the weight's own memory


def test_a_replay_checks_weights_once_copies_in_batches_and_returns_weights_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As torch's cudagraph trees: one C call checks every static input, one batched copy
    refreshes the inputs and one copies the outputs out; an output in a weight's memory is not
    copied."""
    import airstream.runtime.cuda_graphs as cuda_graphs

    executor, _ = _graph_executor(_returns_weight, (6, 6), (6, 6), static=(1,))
    x, w = torch.randn(6, 6), torch.randn(6, 6)
    executor([x, w])  # the capture
    checks: list[int] = []
    copies: list[int] = []
    check, copy = cuda_graphs.data_ptrs_equal, cuda_graphs.foreach_copy

    def counting_check(tensors: Any, ptrs: Any, indices: Any) -> bool:
        checks.append(len(indices))
        return check(tensors, ptrs, indices)

    def counting_copy(dsts: Any, srcs: Any) -> None:
        copies.append(len(dsts))
        copy(dsts, srcs)

    monkeypatch.setattr(cuda_graphs, "data_ptrs_equal", counting_check)
    monkeypatch.setattr(cuda_graphs, "foreach_copy", counting_copy)
    x2 = torch.randn(6, 6)
    a, wt = executor([x2, w])
    assert checks == [1], "one check for every static input"
    assert copies == [1, 1], "one batched copy in (x), one out (a); the weight's view not copied"
    assert_same(a, torch.mm(x2, w).relu())
    assert_same(wt, w.t())
    assert wt.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()
    keep = a.clone()
    executor([torch.randn(6, 6), w])
    assert_same(a, keep), "the copied-out output survives the next replay"


def test_capture_runs_on_private_streams() -> None:
    """Defect 5: label streams shared process-wide joined one thread's capture; the capture
    stream was shared by all executors, with no lock (now one per device, used only under the
    process's capture lock)."""
    executor, api = _graph_executor(_two_streams, (4, 4), (4, 4))
    caller = api.current_stream(CUDA0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    executor([x, w])
    labels = {s.name for s in executor.inner.side_streams(capturing=False)}
    in_capture = _between(api.log, "capture_begin", "capture_end")
    used = {e[1] for e in in_capture if e[0] == "use"}
    assert used and not used & labels, "no label stream joins the capture"
    (begin,) = api.calls("capture_begin")
    assert begin[1] not in labels | {caller.name}, "the capture runs on a stream of its own"
    assert api.current_stream(CUDA0) is caller and not api.capture_of


def test_capture_mode_is_thread_local() -> None:
    """Defect 5: global capture mode makes other threads' CUDA calls fail the capture."""
    graph, pool = mock.Mock(), mock.Mock(id=(0, 1))
    CudaApi().capture_begin(graph, pool)
    graph.capture_begin.assert_called_once_with(pool=(0, 1), capture_error_mode="thread_local")


def test_captures_in_two_threads_run_one_at_a_time_on_the_devices_capture_stream() -> None:
    api = StandInCuda()
    api.capture_delay = 0.05  # a slow capture_begin: two at once would overlap here
    executors = [_graph_executor(_two_streams, (4, 4), (4, 4), api=api)[0] for _ in range(2)]
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    errors: list[BaseException] = []
    results: list[Any] = [None, None]

    def call(i: int) -> None:
        try:
            api.set_stream(api.new_stream(CUDA0, 0))  # each thread on a stream of its own
            results[i] = executors[i]([x, w])
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(e.captures == 1 for e in executors)
    assert api.most_concurrent == 1, "the process-wide capture lock serializes captures"
    begins = {e[1] for e in api.calls("capture_begin")}
    callers = {e[1] for e in api.log if e[0] == "use"} - begins
    assert begins == {api.capture_stream(CUDA0).name}, "one capture stream for the device"
    assert len(callers) >= 2, "neither thread's own stream captures"
    for result in results:
        assert_same(result, _two_streams(x, w))


@pytest.mark.parametrize("release", [(2, 11), (2, 13), (2, 15)], ids=["2.11", "2.13", "2.15"])
def test_a_failed_capture_leaves_the_process_as_before(release: tuple[int, int]) -> None:
    """Defect 2: torch.cuda.graph's exit left the capture stream current, and (torch 2.11)
    capture_end raised before the allocator heard the capture ended: memory grew, the next
    capture failed. Each torch release undoes a different part itself; the stand-in fails an
    op inside the capture the way CUDA does, and models what that release undoes."""
    api = StandInCuda(release=release)
    executor, _ = _graph_executor(_two_streams, (4, 4), (4, 4), api=api)
    caller = api.current_stream(CUDA0)
    api.fail_in_capture = True
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.warns(UserWarning, match="CUDA graph capture failed .*operation not permitted"):
        assert_same(executor([x, w]), _two_streams(x, w))  # the call itself still answers
    assert executor.blockers and "capture failed" in executor.blockers[0]
    assert not api.capture_of, "no stream is left capturing"
    assert not api.pools_allocating, "the allocator no longer believes a capture is running"
    (pool,) = api.pools
    assert pool.use_count() == 1 and not api.violations, "released once: only the pool's own"
    assert api.current_stream(CUDA0) is caller and api.device_now == 0
    (graph,) = [g for g in api.capture_origin if isinstance(g, Graph)]
    assert graph.resets == 1
    api.log.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(100):
            executor([x, w])
    assert not api.calls("capture_begin"), "no capture is tried again"
    other, _ = _graph_executor(_two_streams, (4, 4), (4, 4), api=api)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(other([x, w]), _two_streams(x, w))
    assert other.captures == 1 and not other.blockers, "the next model still captures"
    assert api.pools[-1].use_count() == 2, "the graph's pool: its own use and the capture's"


def test_an_interrupt_during_capture_is_undone_and_propagates() -> None:
    """A KeyboardInterrupt is not a failed capture to fall back from: it reaches the caller,
    after the same undoing."""
    api = StandInCuda()
    executor, _ = _graph_executor(_two_streams, (4, 4), (4, 4), api=api)
    caller = api.current_stream(CUDA0)

    def interrupt(value: Any, stream: Any) -> None:
        if api.capturing_graph() is not None:
            raise KeyboardInterrupt

    api.keep = interrupt  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        executor([torch.randn(4, 4), torch.randn(4, 4)])
    assert not executor.blockers and not api.capture_of and not api.pools_allocating
    assert api.pools[0].use_count() == 1 and not api.violations
    assert api.current_stream(CUDA0) is caller


def test_cublas_workspaces_are_cleared_right_around_the_capture() -> None:
    """A workspace cached by the warm-up (outside the graph's pool) must not be baked into the
    graph: the clear comes after the warm-up, right before capture_begin."""
    executor, api = _graph_executor(_two_streams, (4, 4), (4, 4))
    executor([torch.randn(4, 4), torch.randn(4, 4)])
    replay = next(i for i, e in enumerate(api.log) if e[0] == "replay")
    kinds = [
        e[0]
        for e in api.log[:replay]
        if e[0] in ("clear_cublas_workspaces", "capture_begin", "capture_end", "keep")
    ]
    begin = kinds.index("capture_begin")
    assert kinds[begin - 1] == "clear_cublas_workspaces", "cleared after the warm-up's work"
    end = kinds.index("capture_end")
    assert kinds[end + 1] == "clear_cublas_workspaces", "cleared right after the capture"


def test_a_call_inside_the_users_capture_is_issued_into_it() -> None:
    """A capture nested in the user's own fails: the call joins the user's capture instead, on
    private side streams and with fresh events."""
    executor, api = _graph_executor(_two_streams, (4, 4), (4, 4))
    user = api.new_stream(CUDA0, 0)
    api.set_stream(user)
    user_graph = api.new_graph()
    executor.inner._user_graph = user_graph  # type: ignore[attr-defined]
    api.capture_begin(user_graph, api.new_pool())
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    assert_same(executor([x, w]), _two_streams(x, w))
    assert executor.captures == 0 and len(api.calls("capture_begin")) == 1
    labels = {s.name for s in executor.inner.side_streams(capturing=False)}
    used = {e[1] for e in api.calls("use")} - {user.name}
    assert used and not used & labels, "private side streams join the user's capture"
    api.capture_end(user_graph)
    assert api.current_stream(CUDA0) is user


def test_replays_from_two_caller_streams_are_ordered() -> None:
    """Defect 4: the lock serialized issuing only; a second caller's input copies (on its
    stream) could overwrite the buffers a first caller's replay was still reading."""
    executor, api = _graph_executor(_two_streams, (4, 4), (4, 4))
    a, b = api.new_stream(CUDA0, 0), api.new_stream(CUDA0, 0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    api.set_stream(a)
    executor([x, w])
    api.set_stream(b)
    api.log.clear()
    assert_same(executor([x, w]), _two_streams(x, w))
    done = executor.pool._done[0].name
    wait_at = api.log.index(("wait_event", b.name, done))
    replay_at = next(i for i, e in enumerate(api.log) if e[0] == "replay")
    assert wait_at < replay_at and api.log[replay_at][1] == b.name
    assert api.log[-1] == ("record", b.name, done), "the next caller will wait for this one"


# ---- what cannot be captured ------------------------------------------------------------------


def test_capture_blockers() -> None:
    def reads_back(x: torch.Tensor) -> torch.Tensor:
        return x * x.sum().int().item()

    def cpu_constant(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() + 1).cpu() * torch.tensor([1.0, 2.0])

    def nonzero(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0]

    def mutating(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return torch.rand(2, device=x.device) + x.sum()

    def two_devices(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sin().sum() + y.cos().sum().to(x.device)

    # data-dependent values need symbolic tracing (on CPU tensors: "is on cpu" is reported too)
    symbolic = make_fx(reads_back, tracing_mode="symbolic")(torch.randn(4))
    reasons = " | ".join(capture_blockers(symbolic))
    assert "_local_scalar_dense" in reasons and "reads device data back to the host" in reasons
    reasons = " | ".join(capture_blockers(_trace(cpu_constant, (2,))))
    assert "is on cpu" in reasons and "_tensor_constant0" in reasons
    symbolic = make_fx(nonzero, tracing_mode="symbolic")(torch.randn(4))
    reasons = " | ".join(capture_blockers(symbolic))
    assert "depends on tensor values" in reasons, reasons
    mutates = _trace(mutating, (2,))
    reasons = " | ".join(capture_blockers(mutates))
    expected = "(aten.add_.Tensor) (no source line recorded) writes input x_1, which is not a "
    assert expected + "parameter or buffer" in reasons, reasons
    assert "draws random numbers" in reasons
    assert not any("writes input" in r for r in capture_blockers(mutates, static={0}))
    with FakeTensorMode():
        x0, x1 = torch.empty(2, device=CUDA0), torch.empty(2, device=CUDA1)
    gm = make_fx(two_devices, tracing_mode="fake")(x0, x1)
    reasons = " | ".join(capture_blockers(gm))
    assert "more than one device: cuda:0" in reasons and "cuda:1" in reasons
    assert capture_blockers(_trace(_two_streams, (4, 4), (4, 4))) == []
    sym = make_fx(lambda x: x * 2, tracing_mode="symbolic")(torch.randn(4))
    assert any("symbolic shape" in r for r in capture_blockers(sym))


# ---- as cudagraph trees: a shared pool, a rerecord limit, written buffers ---------------------


def test_a_graph_whose_weights_keep_moving_stops_capturing_at_the_limit_with_one_warning() -> None:
    inner, gm = _executor(_two_streams, (4, 4), (4, 4))
    executor = CudaGraphExecutor(inner, gm, static=(1,), rerecord_limit=2)
    api = inner.api
    assert isinstance(api, StandInCuda)
    x = torch.randn(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # the capture, then two re-records: each call a new weight
            w = torch.randn(4, 4)
            assert_same(executor([x, w]), _two_streams(x, w))
    assert executor.captures == 3 and executor.rerecords == 2
    (pool,) = api.pools
    assert pool.use_count() == 2, "a re-record releases the old graph's use of the pool"
    with pytest.warns(UserWarning, match=r"\(input w_1\) was a new tensor at 3 calls") as caught:
        w = torch.randn(4, 4)
        assert_same(executor([x, w]), _two_streams(x, w))
    assert len(caught) == 1 and "cuda_graph_rerecord_limit=2" in str(caught[0].message)
    assert executor.blockers == ["re-recorded 3 times (rerecord limit reached)"]
    assert pool.use_count() == 1, "the last graph is let go too"
    api.log.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once
        for _ in range(5):
            w = torch.randn(4, 4)
            assert_same(executor([x, w]), _two_streams(x, w))
    assert not api.calls("capture_begin") and not api.calls("replay"), "runs on streams"
    assert executor.captures == 3


def _second_graph(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    air.scope_enter([LABEL], ["side"])
    a = (x * 2).cos()
    air.scope_exit()
    return a + w.sum(), a


def test_graphs_of_one_compiled_function_share_a_pool_capture_stream_and_replay_order() -> None:
    """As a forward and its backward in cudagraph trees: one memory pool, every capture on the
    device's one capture stream (the allocator reuses a pool's free block only on the stream
    that freed it), and a replay waits for the last replay of any graph of the pool."""
    api = StandInCuda()
    pool = CapturePool()
    first, gm1 = _executor(_two_streams, (4, 4), (4, 4), api=api)
    second, gm2 = _executor(_second_graph, (4, 4), (4, 4), api=api)
    forward = CudaGraphExecutor(first, gm1, static=(1,), pool=pool)
    backward = CudaGraphExecutor(second, gm2, pool=pool)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    assert_same(forward([x, w]), _two_streams(x, w))
    assert_same(backward([x, w]), _second_graph(x, w))
    (memory,) = api.pools
    assert memory.use_count() == 3, "the pool's own use and one per captured graph"
    begins = {e[1] for e in api.calls("capture_begin")}
    assert begins == {api.capture_stream(CUDA0).name}
    caller = api.new_stream(CUDA0, 0)
    api.set_stream(caller)
    api.log.clear()
    assert_same(forward([x, w]), _two_streams(x, w))
    assert_same(backward([x, w]), _second_graph(x, w))
    done = pool._done[0].name
    replays = [i for i, e in enumerate(api.log) if e[0] == "replay"]
    waits = [i for i, e in enumerate(api.log) if e == ("wait_event", caller.name, done)]
    records = [i for i, e in enumerate(api.log) if e == ("record", caller.name, done)]
    assert len(replays) == len(waits) == len(records) == 2
    assert waits[0] < replays[0] < records[0] < waits[1] < replays[1] < records[1]
    other = CudaGraphExecutor(_executor(_two_streams, (4, 4), (4, 4), api=api)[0], gm1)
    other([x, w])
    assert len(api.pools) == 2, "another compiled function: a pool of its own"


@pytest.mark.parametrize("release", [(2, 11), (2, 15)], ids=["2.11", "2.15"])
def test_a_failed_capture_in_a_shared_pool_keeps_the_other_graphs_use(
    release: tuple[int, int],
) -> None:
    api = StandInCuda(release=release)
    pool = CapturePool()
    first, gm1 = _executor(_two_streams, (4, 4), (4, 4), api=api)
    second, gm2 = _executor(_reuse, (16,), api=api)
    forward = CudaGraphExecutor(first, gm1, pool=pool)
    backward = CudaGraphExecutor(second, gm2, pool=pool)
    x, w, v = torch.randn(4, 4), torch.randn(4, 4), torch.randn(16)
    forward([x, w])
    api.fail_in_capture = True
    with pytest.warns(UserWarning, match="CUDA graph capture failed"):
        assert_same(backward([v]), _reuse(v))
    (memory,) = api.pools
    assert memory.use_count() == 2 and not api.violations, "only the failed capture's use went"
    assert not api.pools_allocating and not api.capture_of
    api.fail_in_capture = False
    x2 = torch.randn(4, 4)
    assert_same(forward([x2, w]), _two_streams(x2, w))
    assert forward.captures == 1 and len(api.calls("replay")) == 2, "a replay per call"


def _accumulates(x: torch.Tensor, total: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    air.scope_enter([LABEL], ["side"])
    y = x.sin()
    air.scope_exit()
    total.add_(x)  # a buffer kept by the model: a running sum
    return y * total, y


def test_a_graph_writing_a_buffer_is_captured_and_writes_it_once_per_call() -> None:
    """cudagraph trees capture a write to a parameter or buffer; the warm-up runs it on copies,
    so each call writes once; a write to any other input still keeps the graph from capture."""
    executor, api = _graph_executor(_accumulates, (8,), (8,), static=(1,))
    total = torch.zeros(8)
    expected = torch.zeros(8)
    for _ in range(4):
        x = torch.randn(8)
        out = executor([x, total])
        expected += x
        torch.testing.assert_close(total, expected, rtol=0, atol=1e-6)
        assert_same(out[0], x.sin() * expected)
    assert executor.captures == 1 and len(api.calls("replay")) == 4
    assert executor._inputs[1] is total, "the replay writes the buffer itself"
    inner, gm = _executor(_accumulates, (8,), (8,))
    blockers = CudaGraphExecutor(inner, gm).blockers
    assert len(blockers) == 1 and "writes input total_1" in blockers[0], blockers


def test_a_compiled_functions_forward_and_backward_get_one_capture_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The plumbing, on CPU: every graph compiled from one Dynamo graph is handed one pool."""
    import airstream.compiler.measuring as measuring

    pools: list[tuple[str, Any]] = []
    finish = measuring.finish_graph

    def recording(gm: Any, config: Any, kind: str, *args: Any, **kwargs: Any) -> Any:
        pools.append((kind, kwargs.get("capture_pool")))
        return finish(gm, config, kind, *args, **kwargs)

    monkeypatch.setattr(measuring, "finish_graph", recording)
    net = torch.nn.Linear(4, 4)
    compiled, _ = compile_model(net)
    compiled(torch.randn(2, 4)).sum().backward()
    other, _ = compile_model(torch.nn.Linear(4, 4))
    other(torch.randn(2, 4)).sum().backward()
    assert [kind for kind, _ in pools] == ["forward", "backward"] * 2
    assert all(isinstance(pool, CapturePool) for _, pool in pools)
    assert pools[0][1] is pools[1][1] and pools[2][1] is pools[3][1]
    assert pools[0][1] is not pools[2][1]


def test_copies_keep_strides() -> None:
    """Defect 7: clone() made an input with gaps contiguous, and the captured code saw other
    strides than it was compiled for."""
    base = torch.randn(8, 6)
    gappy = base[:, ::2]
    assert copy_like(gappy).stride() == gappy.stride()
    transposed = base.t()
    assert copy_like(transposed).stride() == transposed.stride()
    expanded = torch.randn(4, 1).expand(4, 5)
    copied = copy_like(expanded)
    assert_same(copied, expanded)
    assert copied.is_contiguous()
    assert copy_like(3) == 3


def test_segments_are_compiled_without_inductors_own_cuda_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 7: compile_fx_inner took Inductor's global cudagraphs setting, which would wrap a
    segment in a CUDA graph of its own inside airstream's streams."""
    from airstream.torch_internals import inductor

    seen: list[bool] = []
    real = inductor._get

    def spying(name: str) -> Any:
        value = real(name)
        if name != "inductor_compile":
            return value
        compile_inner, config, *rest = value

        def spy(*args: Any, **kwargs: Any) -> Any:
            seen.append(config.triton.cudagraphs)
            return compile_inner(*args, **kwargs)

        return (spy, config, *rest)

    monkeypatch.setattr(inductor, "_get", spying)
    options = real("inductor_compile")[1]
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"
    config.experimental_config.min_segment_ops = 1
    with options.patch({"triton.cudagraphs": True}):
        compiled, _ = compile_model(lambda x: (x.sin() + 1).cos(), config)
        x = torch.randn(8)
        assert_same(compiled(x), (x.sin() + 1).cos(), rtol=1e-6, atol=1e-6)
    assert seen and not any(seen)


# ---- on a GPU ---------------------------------------------------------------------------------

SLEEP = 2_000_000  # GPU clock cycles (about 1 ms): a side read this late races with main


@torch.library.custom_op("airtest::slow_cos", mutates_args=())
def slow_cos(x: torch.Tensor) -> torch.Tensor:
    """cos(x), read only after the stream has spun for SLEEP cycles."""
    if x.is_cuda:
        airstream.torch_internals.cuda_sleep(SLEEP)
    return x.cos()


@slow_cos.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("airtest::sync_cos", mutates_args=())
def sync_cos(x: torch.Tensor) -> torch.Tensor:
    """cos(x) after reading an element back to the host, which no CUDA graph capture allows
    (the capture rules cannot see it: the op is opaque)."""
    if x.is_cuda:
        float(x[0])
    return x.cos()


@sync_cos.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _slow_reuse(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """As ``_reuse``, with the side read delayed: without record_stream, ``b`` (main) takes
    ``a``'s memory and is written before the side stream reads ``a``."""
    a = x * 2
    air.scope_enter([LABEL], ["side"])
    s = torch.ops.airtest.slow_cos(a)
    air.scope_exit()
    b = x * 3
    return s, b + 1


class _NoKeep(CudaApi):
    """The runtime with the fix taken out: no record_stream for values crossing streams."""

    def keep(self, value: Any, stream: Any) -> None:
        pass


def _real(fn: Callable[..., Any], *inputs: torch.Tensor, api: CudaApi | None = None) -> Any:
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    plan = build_plan(gm, assign_streams(gm))
    executor = CudaExecutor(gm, plan, inputs[0].device, api=api)
    return executor, gm


def _mismatches(run: Callable[[torch.Tensor], Any], calls: int = 20) -> int:
    bad = 0
    for i in range(calls):
        x = torch.full((1 << 20,), float(i % 7), device="cuda")
        s, b = run(x)
        torch.cuda.synchronize()
        bad += not (torch.equal(s, (x * 2).cos()) and torch.equal(b, x * 3 + 1))
    return bad


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("capture", [False, True], ids=["streams", "cuda-graph"])
def test_cuda_memory_read_on_a_side_stream_is_not_reused(capture: bool) -> None:
    x = torch.zeros(1 << 20, device="cuda")

    def runner(api: CudaApi | None) -> Callable[[torch.Tensor], Any]:
        executor, gm = _real(_slow_reuse, x, api=api)
        if not capture:
            return lambda t: executor([t])
        graphed = CudaGraphExecutor(executor, gm)
        assert not graphed.blockers, graphed.blockers

        def call(t: torch.Tensor) -> Any:
            out = graphed([t])
            assert graphed.captures == 1
            return out

        return call

    assert _mismatches(runner(None)) == 0
    assert _mismatches(runner(_NoKeep())) > 0, "the test sees the race without the fix"


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_inputs_from_a_users_stream_and_outputs_used_without_sync(mode: str) -> None:
    config = airstream.CompilerConfig()
    config.mode = mode
    w = torch.randn(512, 512, device="cuda")
    compiled, backend = compile_model(lambda x: _two_streams(x, w), config)
    user = torch.cuda.Stream()
    with torch.cuda.stream(user):
        for i in range(20):
            airstream.torch_internals.cuda_sleep(SLEEP)  # the input is made late on `user`
            x = torch.full((512, 512), 0.01 * i, device="cuda")
            out = compiled(x)
            y = out[0] * 1  # used on `user` with no sync
            expected = _two_streams(x, w)[0]
            torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    if mode == "reduce-overhead":
        executor = graph_of(backend, "inference").executor
        assert isinstance(executor, CudaGraphExecutor) and executor.captures == 1


def _devices_and_streams() -> tuple[int, list[Any]]:
    count = torch.cuda.device_count()
    return torch.cuda.current_device(), [torch.cuda.current_stream(d) for d in range(count)]


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_call_leaves_current_stream_and_device(mode: str) -> None:
    config = airstream.CompilerConfig()
    config.mode = mode
    w = torch.randn(64, 64, device="cuda")
    compiled, _ = compile_model(lambda x: _two_streams(x, w), config)
    mine = torch.cuda.Stream()
    with torch.cuda.stream(mine):
        before = _devices_and_streams()
        for _ in range(3):
            compiled(torch.randn(64, 64, device="cuda"))
        assert _devices_and_streams() == before


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_model_on_a_second_gpu_captures_there_and_leaves_the_device() -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    w = torch.randn(64, 64, device="cuda:1")
    compiled, backend = compile_model(lambda x: _two_streams(x, w))
    torch.cuda.set_device(0)
    before = _devices_and_streams()
    x = torch.randn(64, 64, device="cuda:1")
    for _ in range(3):
        torch.testing.assert_close(compiled(x), _two_streams(x, w), rtol=1e-4, atol=1e-4)
    assert _devices_and_streams() == before
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and executor.captures == 1
    assert executor.device == torch.device("cuda", 1)


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_two_threads_on_two_streams_replay_correctly() -> None:
    w = torch.randn(256, 256, device="cuda")
    compiled, backend = compile_model(lambda x: _two_streams(x, w))
    compiled(torch.randn(256, 256, device="cuda"))  # compile and capture once
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for i in range(50):
                    x = torch.full((256, 256), 0.001 * (seed * 100 + i), device="cuda")
                    if i % 5 == 0:
                        airstream.torch_internals.cuda_sleep(SLEEP // 4)
                    out = compiled(x)
                    torch.testing.assert_close(out, _two_streams(x, w), rtol=1e-4, atol=1e-4)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and executor.captures == 1


def _sync_on_side(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x * 2
    air.scope_enter([LABEL], ["side"])
    s = torch.ops.airtest.sync_cos(a)
    air.scope_exit()
    return s, a + 1


@pytest.mark.cuda
def test_cuda_failed_capture_then_flat_memory_and_the_next_model_captures() -> None:
    x = torch.randn(1 << 20, device="cuda")
    executor, gm = _real(_sync_on_side, x)
    graphed = CudaGraphExecutor(executor, gm)
    assert not graphed.blockers  # the sync is invisible to the rules: capture must fail
    stream = torch.cuda.current_stream()
    with pytest.warns(UserWarning, match="CUDA graph capture failed"):
        graphed([x])
    assert torch.cuda.current_stream() == stream and not torch.cuda.is_current_stream_capturing()
    torch.cuda.empty_cache()  # fails for good if a pool's use count went below zero
    for _ in range(10):
        graphed([x])
    torch.cuda.synchronize()
    # a free deferred for good (the allocator still believing a capture runs) grows what is
    # reserved, not what is allocated
    settled = torch.cuda.memory_reserved()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(100):
            s, _ = graphed([x])
            torch.testing.assert_close(s, (x * 2).cos())
        torch.cuda.synchronize()
        assert torch.cuda.memory_reserved() <= settled + (2 << 20), "freed memory is reused"
        torch.cuda.empty_cache()
        other, ogm = _real(_slow_reuse, x)
        next_model = CudaGraphExecutor(other, ogm)
        s, _ = next_model([x])
        torch.testing.assert_close(s, (x * 2).cos())
    assert next_model.captures == 1 and not next_model.blockers


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_profile_shows_side_kernels_on_their_own_stream_overlapping(tmp_path: Any) -> None:
    import json

    from torch.profiler import ProfilerActivity, profile

    config = airstream.CompilerConfig()
    config.mode = "max-autotune"  # streams without capture, Triton segments on every stream
    config.experimental_config.min_segment_ops = 1
    w = torch.randn(2048, 2048, device="cuda")

    def model(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        air.scope_enter([LABEL], ["side"])
        s = torch.ops.airtest.slow_cos(x)
        side = (s.sin() + 1) * 2  # a Triton segment on the side stream
        air.scope_exit()
        main = torch.mm(x, w).relu()
        for _ in range(8):
            main = torch.mm(main, w).relu()
        return side, main

    compiled, backend = compile_model(model, config)
    x = torch.randn(2048, 2048, device="cuda")
    compiled(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        compiled(x)
        torch.cuda.synchronize()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    streams: dict[int, list[tuple[float, float, str]]] = {}
    for k in kernels:
        streams.setdefault(k["args"]["stream"], []).append((k["ts"], k["ts"] + k["dur"], k["name"]))
    assert len(streams) >= 2, f"kernels on {len(streams)} stream(s)"
    side = next(s for s, ks in streams.items() if any("spin_kernel" in n for *_, n in ks))
    side_kernels = streams[side]
    assert any("triton" in n.lower() for *_, n in side_kernels), side_kernels
    main = [k for s, ks in streams.items() if s != side for k in ks]
    overlaps = any(a0 < b1 and b0 < a1 for a0, a1, _ in side_kernels for b0, b1, _ in main)
    assert overlaps, "side and main kernels overlap in time"
    assert graph_of(backend, "inference").segments


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_replay_memory_stays_below_one_and_a_half_times_the_weights() -> None:
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda().eval()
    weights = torch.cuda.memory_allocated() - start
    compiled, backend = compile_model(model)
    with torch.no_grad():
        for _ in range(5):
            out = compiled(torch.randn(16, 2048, device="cuda"))
    torch.cuda.synchronize()
    total = torch.cuda.memory_allocated() - start
    assert total < 1.5 * weights, f"{total / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB"
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and executor.captures == 1
    del out


@pytest.mark.cuda
def test_cuda_error_on_a_side_stream_restores_state() -> None:
    x = torch.rand(4096, device="cuda")
    executor, _ = _real(_fails_on_side, x)
    stream = torch.cuda.current_stream()
    before = _devices_and_streams()
    with pytest.raises(ValueError, match="negative input"):
        executor([-x])
    assert _devices_and_streams() == before and torch.cuda.current_stream() == stream
    out = executor([x])
    torch.testing.assert_close(out, _fails_on_side(x))


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_guide_example_matches_eager() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    compiled, backend = compile_model(Model().cuda(), config)
    for _ in range(20):
        x = torch.randn(512, 512, device="cuda")
        torch.testing.assert_close(compiled(x), Model()(x), rtol=1e-4, atol=1e-4)
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and not executor.blockers
    assert executor.captures == 1


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_streams_without_graphs_and_outputs_do_not_alias() -> None:
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"  # no CUDA graph: the stream executor, with Triton segments
    config.experimental_config.min_segment_ops = 1
    w = torch.randn(512, 512, device="cuda")
    compiled, backend = compile_model(lambda x: _two_streams(x, w), config)
    first = compiled(torch.randn(512, 512, device="cuda"))
    graph = graph_of(backend, "inference")
    assert isinstance(graph.executor, CudaExecutor)
    assert graph.segments and all(s.node is not None for s in graph.segments)
    x = torch.randn(512, 512, device="cuda")
    torch.testing.assert_close(compiled(x), _two_streams(x, w), rtol=1e-4, atol=1e-4)
    assert first[0].data_ptr() != compiled(x)[0].data_ptr()


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_training_with_streams_matches_eager() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(256, 256), torch.nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("side"):
                left = self.a(x).relu()
            return (left * self.b(x).tanh()).sum()

    net = Net().cuda()
    ref = Net().cuda()
    ref.load_state_dict(net.state_dict())
    compiled, backend = compile_model(net)
    for _ in range(3):
        x = torch.randn(64, 256, device="cuda")
        net.zero_grad()
        ref.zero_grad()
        compiled(x).backward()
        ref(x).backward()
        for p, q in zip(net.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    for kind in ("forward", "backward"):
        executor = graph_of(backend, kind).executor
        assert isinstance(executor, CudaGraphExecutor) and executor.captures == 1, kind


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_forward_and_backward_capture_into_one_pool() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("side"):
                left = self.a(x).relu()
            return (left * self.b(x).tanh()).sum()

    net = Net().cuda()
    ref = Net().cuda()
    ref.load_state_dict(net.state_dict())
    compiled, backend = compile_model(net)
    for _ in range(4):
        x = torch.randn(256, 512, device="cuda")
        net.zero_grad()
        ref.zero_grad()
        compiled(x).backward()
        ref(x).backward()
        for p, q in zip(net.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    forward = graph_of(backend, "forward").executor
    backward = graph_of(backend, "backward").executor
    assert isinstance(forward, CudaGraphExecutor) and isinstance(backward, CudaGraphExecutor)
    assert forward.captures == backward.captures == 1
    assert forward.pool is backward.pool, "one pool, as cudagraph trees' forward and backward"
    (memory,) = forward.pool._memory.values()
    assert memory.use_count() >= 3, "the pool's own use and one per captured graph"


@pytest.mark.cuda
def test_cuda_weights_replaced_each_call_stop_capturing_at_the_limit() -> None:
    x, w = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
    executor, gm = _real(_two_streams, x, w)
    graphed = CudaGraphExecutor(executor, gm, static=(1,), rerecord_limit=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            w = torch.randn(256, 256, device="cuda")
            torch.testing.assert_close(graphed([x, w]), _two_streams(x, w))
    assert graphed.captures == 4
    with pytest.warns(UserWarning, match=r"\(input w_1\) was a new tensor"):
        w = torch.randn(256, 256, device="cuda")
        torch.testing.assert_close(graphed([x, w]), _two_streams(x, w))
    torch.cuda.synchronize()
    settled = torch.cuda.memory_reserved()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            w = torch.randn(256, 256, device="cuda")
            torch.testing.assert_close(graphed([x, w]), _two_streams(x, w))
    torch.cuda.synchronize()
    assert graphed.captures == 4 and torch.cuda.memory_reserved() <= settled + (4 << 20)


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_a_model_writing_its_buffer_is_captured_and_matches_eager() -> None:
    class Running(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(256, 256)
            self.register_buffer("total", torch.zeros(256))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("side"):
                y = self.lin(x).relu()
            self.total.add_(x.sum(0))
            return y * self.total

    model = Running().cuda()
    ref = Running().cuda()
    ref.load_state_dict(model.state_dict())
    compiled, backend = compile_model(model)
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(64, 256, device="cuda")
            torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(model.total, ref.total, rtol=1e-5, atol=1e-5)
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and not executor.blockers
    assert executor.captures == 1


def test_static_inputs_are_the_parameters_and_buffers() -> None:
    from airstream import torch_internals

    seen: list[Any] = []

    def compiler(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        seen.append(torch_internals.static_input_indices())
        seen.append([tuple(i.shape) for i in inputs])
        return airstream.get_compiler()(gm, inputs)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    backend = torch_internals.aot_autograd(fw_compiler=compiler)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    static, shapes = seen[0], seen[1]
    assert static is not None
    # Linear's weight and bias, BatchNorm's weight, bias, running mean and variance, and its
    # step counter: static; the one input that is not is x
    dynamic = [i for i in range(len(shapes)) if i not in static]
    assert len(dynamic) == 1 and shapes[dynamic[0]] == (3, 4), (static, shapes)
