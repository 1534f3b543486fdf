"""The CUDA path's second pass (issue 51), each defect on the stand-in for CUDA
(``tests/cuda_standin.py``), and on a GPU where it needs one (``cuda``-marked, run by
``tools/gpu-check``).

1. after a replay the user's side streams are ordered after the call;
2. training under capture: no weight and no saved activation copied per replay;
3. a stream priority outside the device's range is clamped, with one warning;
4. a failure while setting a capture up falls back like a failed capture;
5. capture and private streams are airstream's own, not torch's shared pool's;
6. inside the user's ``torch.cuda.graph`` the user's events and streams are acted on;
7. a capture that cannot happen says why, once;
8. memory used across streams around a capture is kept for the stream that uses it;
9. a collective off the main stream keeps the graph from capture.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from tests.conftest import assert_same
from tests.cuda_standin import StandInCuda
from tests.test_cuda_runtime import (
    CUDA0,
    LABEL,
    _executor,
    _graph_executor,
    _trace,
    _two_streams,
)
from tests.test_torch_streams_cuda import ALT, _model, _native_graph
from tests.test_torch_streams_cuda import _executor as _native_executor

from airstream.graph.streams import assign_streams
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.cuda_graphs import CudaGraphExecutor, capture_blockers
from airstream.schedule.plan import build_plan

pytestmark = pytest.mark.torch_api

air = torch.ops.air


def _between_replay(log: list[tuple[Any, ...]]) -> tuple[list[Any], list[Any]]:
    at = next(i for i, e in enumerate(log) if e[0] == "replay")
    return log[:at], log[at + 1 :]


# ---- 1. the user's side streams after a replay ---------------------------------------------------


def test_after_a_replay_the_users_side_stream_waits_for_the_call() -> None:
    """Without capture the side work runs on the user's ``alt``, so code after the call that
    waits for ``alt`` sees it; the replay runs on the caller's stream, so ``alt`` must wait for
    the replay (and the replay for ``alt``'s earlier work)."""
    api = StandInCuda()
    gm = _native_graph()
    inner, _ = _native_executor(api, gm)
    executor = CudaGraphExecutor(inner, gm)
    caller = api.current_stream(CUDA0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    executor([x, w])
    api.log.clear()
    rows = executor([x, w])  # make_fx's graph returns one tensor, which the replay unpacks
    assert_same(torch.stack(list(rows)), _model(x, w))
    before, after = _between_replay(api.log)
    assert ("wait_stream", caller.name, "alt") in before, "the replay follows alt's earlier work"
    assert ("wait_stream", "alt", caller.name) in after, "alt's later work follows the replay"


# ---- 2. training under capture -------------------------------------------------------------------


def _forward(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An AOTAutograd forward: the user's output, then what it saves (an activation, the weight)."""
    h = torch.mm(x, w)
    air.scope_enter([LABEL], ["side"])
    out = h.relu() * 2
    air.scope_exit()
    return out, h, w


def _backward(h: torch.Tensor, w: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor]:
    air.scope_enter([LABEL], ["side"])
    g = grad * (h > 0) * 2
    air.scope_exit()
    return (torch.mm(g, w.t()),)


def _training_pair(api: StandInCuda) -> tuple[CudaGraphExecutor, CudaGraphExecutor]:
    pool = CapturePool()
    fw, fgm = _executor(_forward, (6, 6), (6, 6), api=api)
    bw, bgm = _executor(_backward, (6, 6), (6, 6), (6, 6), api=api)
    forward = CudaGraphExecutor(fw, fgm, static=(1,), pool=pool, saved=range(1, 3))
    backward = CudaGraphExecutor(bw, bgm, pool=pool)
    return forward, backward


def _step(
    forward: CudaGraphExecutor, backward: CudaGraphExecutor, x: torch.Tensor, w: torch.Tensor
) -> None:
    out, h, saved_w = forward([x, w])
    assert_same(out, _forward(x, w)[0])
    grad = torch.randn(6, 6)
    (gx,) = backward([h, saved_w, grad])
    assert_same(gx, _backward(x @ w, w, grad)[0])


def test_training_hands_saved_tensors_over_and_copies_only_the_tangents() -> None:
    api = StandInCuda()
    forward, backward = _training_pair(api)
    w = torch.randn(6, 6)
    for _ in range(3):
        _step(forward, backward, torch.randn(6, 6), w)
    assert forward.captures == backward.captures == 1
    assert forward._own == [0], "only the user's output is copied out"
    assert forward._handed == [1], "the activation is handed over (the weight is the weight)"
    assert [i for i, _ in backward._copies] == [2], "the backward copies in its tangent only"
    assert backward._static_indices == [0, 1] and backward._received == [0]
    assert backward._inputs[0] is None, "nothing keeps the handed-over activation alive"
    _, h, saved_w = forward([torch.randn(6, 6), w])
    assert saved_w is w, "the weight is returned as it is, never copied"
    assert h.data_ptr() == forward._static_outputs[1].data_ptr(), "handed over in the pool"
    assert len(api.calls("replay")) == 7


def test_a_second_forward_before_the_backward_runs_without_its_graph_and_both_stay_right() -> None:
    api = StandInCuda()
    forward, backward = _training_pair(api)
    w = torch.randn(6, 6)
    _step(forward, backward, torch.randn(6, 6), w)  # both captured
    x1, x2 = torch.randn(6, 6), torch.randn(6, 6)
    _, h1, w1 = forward([x1, w])
    with pytest.warns(UserWarning, match="saved for the backward are still held") as caught:
        _, h2, w2 = forward([x2, w])  # a replay would overwrite h1
    assert len(caught) == 1
    assert h2.data_ptr() != h1.data_ptr() and forward.uncaptured_calls == 1
    g1, g2 = torch.randn(6, 6), torch.randn(6, 6)
    with pytest.warns(UserWarning, match="came from a call without its graph"):
        (gx2,) = backward([h2, w2, g2])
    (gx1,) = backward([h1, w1, g1])  # replayed: h1 is where the graph reads it
    assert_same(gx1, _backward(x1 @ w, w, g1)[0])
    assert_same(gx2, _backward(x2 @ w, w, g2)[0])
    assert backward.captures == 1 and backward.uncaptured_calls == 1
    del h1, h2, w1, w2
    replays = len(api.calls("replay"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _step(forward, backward, torch.randn(6, 6), w)
    assert len(api.calls("replay")) == replays + 2, "both replay again once nothing is held"


# ---- 3. priorities -------------------------------------------------------------------------------


def _priority(priority: int, label: str = "side") -> Any:
    def fn(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL, "_user_stream_priority"], [label, str(priority)])
        a = x.sin()
        air.scope_exit()
        return a + x.cos()

    return fn


def test_a_positive_priority_runs_at_the_least_urgent_level_with_one_warning() -> None:
    api = StandInCuda()
    executor, _ = _executor(_priority(1), (8,), api=api)
    x = torch.randn(8)
    with pytest.warns(UserWarning, match=r"stream priority 1 is outside .*\[-5, 0\]") as caught:
        assert_same(executor([x]), _priority(1)(x))
    assert len(caught) == 1 and api.pool_draws == [(0, 0)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        executor([x])


def test_priorities_past_the_range_are_counted_in_the_pool_they_share() -> None:
    """-7 and -9 both get torch's most urgent pool (-5): two draws there, with a pool of one."""
    api = StandInCuda(pool_size=1)
    api.label_stream(CUDA0, "a", -7)
    with pytest.warns(UserWarning, match=r"at priority -5, .*label 'b' shares with label 'a'"):
        api.label_stream(CUDA0, "b", -9)


# ---- 4. a failure while setting a capture up -----------------------------------------------------


def test_a_capture_whose_set_up_fails_falls_back_once_and_leaves_nothing_behind() -> None:
    """As ``torch.cuda.MemPool()`` under ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``."""
    executor, api = _graph_executor(_two_streams, (4, 4), (4, 4))

    def no_pool() -> Any:
        raise RuntimeError("MemPool is not supported by the cudaMallocAsync allocator")

    api.new_pool = no_pool  # type: ignore[method-assign]
    caller = api.current_stream(CUDA0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.warns(UserWarning, match=r"capture failed \(setting the capture up: .*MemPool"):
        assert_same(executor([x, w]), _two_streams(x, w))
    assert executor.status.startswith("not captured: capture failed")
    assert api.current_stream(CUDA0) is caller and not api.capture_of
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert_same(executor([x, w]), _two_streams(x, w))
    assert not api.calls("capture_begin")


# ---- 5. streams of airstream's own ---------------------------------------------------------------


def test_capture_and_private_streams_are_created_outside_torchs_pool() -> None:
    executor, api = _graph_executor(_two_streams, (4, 4), (4, 4))
    executor([torch.randn(4, 4), torch.randn(4, 4)])
    (begin,) = api.calls("capture_begin")
    dedicated = {s.name for s in api.dedicated}
    assert begin[1] in dedicated, "the capture stream is airstream's own"
    in_capture = api.log[api.log.index(begin) : api.log.index(api.calls("capture_end")[0])]
    sides = {e[1] for e in in_capture if e[0] == "use"} - {begin[1]}
    assert sides and sides <= dedicated, "so are the side streams joining the capture"
    assert len(api.pool_draws) == 1, "only the label stream comes from the pool"


def test_without_the_cuda_runtime_library_pool_streams_stand_in_with_one_warning() -> None:
    api = StandInCuda()
    api.dedicated_streams = False
    with pytest.warns(UserWarning, match="could not create CUDA streams of its own") as caught:
        api.capture_stream(CUDA0)
        api.private_stream(CUDA0, "capture side 1")
    assert len(caught) == 1 and len(api.pool_draws) == 2


# ---- 6. inside the user's own capture ------------------------------------------------------------


def test_inside_the_users_capture_the_users_stream_and_events_are_used() -> None:
    api = StandInCuda()
    gm = _native_graph()
    inner, objects = _native_executor(api, gm)
    executor = CudaGraphExecutor(inner, gm)
    user = api.new_stream(CUDA0, 0)
    api.set_stream(user)
    graph = api.new_graph()
    api.capture_begin(graph, api.new_pool())
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    api.log.clear()
    assert_same(executor([x, w]), _model(x, w))
    assert ("record", "alt", "user_ev") in api.log, "the user's event is recorded in the capture"
    assert ("wait_event", "alt", "outside_ev") in api.log
    assert "alt" in {e[1] for e in api.calls("use")}, "side work on the user's stream, as eager"
    assert api.capture_of.get(objects[ALT]) is graph, "alt joined the user's capture"
    api.capture_end(graph)
    assert executor.captures == 0


# ---- 7. a capture that cannot happen -------------------------------------------------------------


def test_a_blocked_capture_says_why_once() -> None:
    def draws(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["side"])
        a = torch.nn.functional.dropout(x, 0.5)
        air.scope_exit()
        return a + x

    inner, gm = _executor(draws, (8,))
    executor = CudaGraphExecutor(inner, gm)
    assert executor.status.startswith("not captured: ") and "random" in executor.status
    with pytest.warns(UserWarning, match=r"not captured into a CUDA graph .*draws random"):
        executor([torch.randn(8)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        executor([torch.randn(8)])
    ok, _ = _graph_executor(_two_streams, (4, 4), (4, 4))
    assert ok.status == "not captured yet"
    ok([torch.randn(4, 4), torch.randn(4, 4)])
    assert ok.status == "captured"


# ---- 8. memory around a capture ------------------------------------------------------------------


def test_memory_crossing_streams_around_a_capture_is_kept_for_its_user() -> None:
    executor, api = _graph_executor(_two_streams, (4, 4), (4, 4), static=(1,))
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    executor([x, w])
    capture = api.capture_stream(CUDA0).name
    warm_up = api.log[: next(i for i, e in enumerate(api.log) if e == ("use", capture))]
    kept = [e for e in warm_up if e[0] == "keep" and e[1] == capture]
    assert len(kept) == 1, "the input's buffer, made on the caller's stream, is kept for capture"
    other = api.new_stream(CUDA0, 0)
    api.set_stream(other)
    api.log.clear()
    executor([x, w])
    executor([x, w])
    assert [e[1] for e in api.calls("keep") if e[1] == other.name] == [other.name], (
        "the buffer is kept once for each new caller stream"
    )


# ---- 9. collectives under capture ----------------------------------------------------------------


def test_a_collective_off_the_main_stream_keeps_the_graph_from_capture() -> None:
    from airstream import torch_internals

    all_reduce = torch_internals.collective_op("all_reduce")

    def side(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["comm"])
        y = all_reduce(x.sin(), "sum", "0")
        air.scope_exit()
        return y + x

    def main(x: torch.Tensor) -> torch.Tensor:
        y = all_reduce(x.sin(), "sum", "0")
        air.scope_enter([LABEL], ["side"])
        z = x.cos()
        air.scope_exit()
        return y + z

    for fn, blocked in ((side, True), (main, False)):
        gm = _trace(fn, (8,))
        stream_of = build_plan(gm, assign_streams(gm)).stream_of()
        reasons = capture_blockers(gm, (), stream_of)
        assert any("collective on stream 'comm'" in r for r in reasons) == blocked, reasons


def test_a_forwards_saved_tensors_start_where_torch_says() -> None:
    """What select.py hands a forward's CudaGraphExecutor as ``saved``, read in a real compile."""
    import airstream
    from airstream import torch_internals

    seen: list[tuple[int | None, int]] = []

    def compiler(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        (output,) = gm.graph.find_nodes(op="output")
        seen.append((torch_internals.saved_for_backward_start(), len(output.args[0])))
        return airstream.get_compiler()(gm, inputs)

    net = torch.nn.Linear(4, 4)
    backend = torch_internals.aot_autograd(fw_compiler=compiler, bw_compiler=compiler)
    compiled = torch.compile(net, backend=backend)
    x = torch.randn(3, 4, requires_grad=True)
    compiled(x).relu().sum().backward()
    (start, outputs), _ = seen
    assert start == 1 and outputs > 1, "one user output, then what the backward saves"


# ---- on a GPU ----------------------------------------------------------------------------------


def _gpu_config(mode: str = "reduce-overhead") -> Any:
    import airstream

    config = airstream.CompilerConfig()
    config.mode = mode
    return config


def _executor_of(backend: Any, kind: str = "inference") -> CudaGraphExecutor:
    from tests.conftest import graph_of

    executor = graph_of(backend, kind).executor
    assert isinstance(executor, CudaGraphExecutor), type(executor)
    return executor


@pytest.mark.cuda
def test_cuda_the_users_stream_after_a_replay_sees_the_call() -> None:
    from tests.conftest import compile_model

    alt = torch.cuda.Stream()

    def model(x: torch.Tensor) -> torch.Tensor:
        alt.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(alt):
            y = torch.ops.airtest.slow_cos(x) * 2  # made late on alt, left for the caller
        return y

    compiled, backend = compile_model(model, _gpu_config())
    other = torch.cuda.Stream()
    bad = 0
    for i in range(10):
        x = torch.full((1 << 20,), float(i), device="cuda")
        y = compiled(x)
        other.wait_stream(alt)  # what eager code does before using alt's result elsewhere
        with torch.cuda.stream(other):
            got = y * 1
        torch.cuda.synchronize()
        bad += not torch.equal(got, x.cos() * 2)
    assert bad == 0, f"{bad} of 10 reads on another stream raced with the replay"
    assert _executor_of(backend).captures == 1


@pytest.mark.cuda
def test_cuda_training_under_capture_holds_at_most_eagers_memory_plus_the_pool() -> None:
    """The bound: a captured training step's peak, over the memory held before it, is at most
    eager's plus the graphs' pool; no weight and no saved activation is copied per replay."""
    from tests.conftest import compile_model

    def net() -> torch.nn.Module:
        torch.manual_seed(0)
        layers: list[torch.nn.Module] = []
        for _ in range(4):
            layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers).cuda()

    def peak_of_a_step(run: Any) -> int:
        x = torch.randn(512, 2048, device="cuda")
        for _ in range(3):  # warm-up, capture, a replay
            run(x).sum().backward()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run(x).sum().backward()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before

    eager_model = net()
    eager = peak_of_a_step(eager_model)
    del eager_model
    model = net()
    compiled, backend = compile_model(model, _gpu_config())
    captured = peak_of_a_step(compiled)
    forward, backward = _executor_of(backend, "forward"), _executor_of(backend, "backward")
    assert forward.captures == backward.captures == 1 and not forward.uncaptured_calls
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    copied = {b.untyped_storage().data_ptr() for _, b in backward._copies}
    assert not copied & params and len(backward._copies) == 1, "only the tangent is copied"
    assert backward._received, "the saved activations are read where the forward left them"
    (memory,) = forward.pool._memory.values()
    pool = sum(
        s["total_size"]
        for s in torch.cuda.memory_snapshot()
        if tuple(s.get("segment_pool_id", ())) == tuple(memory.id)
    )
    assert captured <= eager + pool, f"{captured >> 20} MiB > {eager >> 20} + {pool >> 20} MiB"


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_cuda_priority_1_runs(mode: str) -> None:
    from tests.conftest import compile_model

    import airstream

    w = torch.randn(256, 256, device="cuda")

    def model(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("low", priority=1):
            a = torch.mm(x, w).relu()
        return a + torch.mm(w, x).sigmoid()

    compiled, _ = compile_model(model, _gpu_config(mode))
    x = torch.randn(256, 256, device="cuda")
    with pytest.warns(UserWarning, match="stream priority 1 is outside"):
        out = compiled(x)
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_a_failing_capture_set_up_falls_back() -> None:
    """As ``MemPool()`` fails under ``PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync``."""
    from tests.test_cuda_runtime import _real

    from airstream.runtime.cuda_api import CudaApi

    class NoPool(CudaApi):
        def new_pool(self) -> Any:
            raise RuntimeError("MemPool is not supported by this allocator")

    x, w = torch.randn(256, 256, device="cuda"), torch.randn(256, 256, device="cuda")
    executor, gm = _real(_two_streams, x, w, api=NoPool())
    graphed = CudaGraphExecutor(executor, gm, static=(1,))
    with pytest.warns(UserWarning, match="setting the capture up"):
        first = graphed([x, w])
    assert not torch.cuda.is_current_stream_capturing()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            torch.testing.assert_close(graphed([x, w]), _two_streams(x, w))
    torch.testing.assert_close(first, _two_streams(x, w))


@pytest.mark.cuda
@pytest.mark.filterwarnings("error")
def test_cuda_outputs_of_replay_n_are_intact_after_replay_n_plus_1() -> None:
    from tests.conftest import compile_model

    w = torch.randn(512, 512, device="cuda")
    compiled, backend = compile_model(lambda x: _two_streams(x, w), _gpu_config())
    xs = [torch.randn(512, 512, device="cuda") for _ in range(4)]
    outs = [compiled(x) for x in xs]
    torch.cuda.synchronize()
    for x, out in zip(xs, outs, strict=True):
        torch.testing.assert_close(out, _two_streams(x, w), rtol=1e-4, atol=1e-4)
    assert _executor_of(backend).captures == 1


@pytest.mark.cuda
def test_cuda_the_users_cuda_graph_around_a_compiled_call() -> None:
    from tests.conftest import compile_model

    alt = torch.cuda.Stream()
    done = torch.cuda.Event()
    w = torch.randn(256, 256, device="cuda")

    def model(x: torch.Tensor) -> torch.Tensor:
        alt.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(alt):
            side = torch.mm(x, w).relu()
            done.record()
        main = torch.mm(w, x).sigmoid()
        torch.cuda.current_stream().wait_event(done)
        return side + main

    compiled, _ = compile_model(model, _gpu_config())
    static = torch.randn(256, 256, device="cuda")
    for _ in range(3):
        compiled(static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = compiled(static)
        torch.cuda.current_stream().wait_event(done)  # the user's event, recorded in the graph
    for i in range(3):
        static.copy_(torch.full_like(static, 0.01 * i))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, model(static), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_a_blocked_capture_is_reported_once_with_its_cause() -> None:
    from tests.conftest import compile_model

    w = torch.randn(256, 256, device="cuda")

    def model(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(torch.mm(x, w), 0.5, training=True) + 1

    compiled, backend = compile_model(model, _gpu_config())
    x = torch.randn(256, 256, device="cuda")
    with pytest.warns(UserWarning, match="draws random numbers") as caught:
        for _ in range(3):
            compiled(x)
    assert len([c for c in caught if "not captured" in str(c.message)]) == 1
    assert _executor_of(backend).status.startswith("not captured: ")


def test_reports_say_per_graph_whether_it_is_captured() -> None:
    """What ``airstream explain`` prints (``cuda graph: ...``) and benches report."""
    from types import SimpleNamespace

    from airstream.bench.timing import cuda_graphs
    from airstream.runtime.cuda_graphs import capture_statuses

    ok, _ = _graph_executor(_two_streams, (4, 4), (4, 4))
    ok([torch.randn(4, 4), torch.randn(4, 4)])
    inner, gm = _executor(lambda x: torch.nn.functional.dropout(x, 0.5) + 1, (8,))
    blocked = CudaGraphExecutor(inner, gm)
    measured = SimpleNamespace(candidates={"one stream": ok, "placed": blocked})
    assert capture_statuses(ok) == ["captured"]
    (one, placed) = capture_statuses(measured)
    assert one == "one stream: captured" and placed.startswith("placed: not captured: ")
    assert capture_statuses(inner) == []
    backends = {
        "a": SimpleNamespace(graphs=[SimpleNamespace(executor=ok)]),
        "b": SimpleNamespace(graphs=[SimpleNamespace(executor=inner)]),
    }
    assert cuda_graphs(backends) == {"a": ["captured"]}


def test_a_backward_fed_by_two_forwards_of_its_pool_captures_again_without_counting() -> None:
    """Measured candidates: two forwards of one pool take turns, so the backward's saved tensors
    arrive from either's memory; it captures for the new ones without nearing the rerecord limit
    (which counts weights replaced by new tensors)."""
    api = StandInCuda()
    first, backward = _training_pair(api)
    fw, fgm = _executor(_forward, (6, 6), (6, 6), api=api)
    second = CudaGraphExecutor(fw, fgm, static=(1,), pool=first.pool, saved=range(1, 3))
    w = torch.randn(6, 6)
    for forward in (first, second, first, second):
        _step(forward, backward, torch.randn(6, 6), w)
    assert backward.captures == 4 and backward.rerecords == 0 and not backward.uncaptured_calls
