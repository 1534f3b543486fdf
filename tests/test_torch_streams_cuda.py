"""PyTorch's stream IR on CUDA: side work runs on the model's own stream objects, the user's
events are recorded and waited for on them, and reduce-overhead's replay keeps both promises
for code outside the compiled region.

Without a GPU the CUDA runtime runs against the stand-in (``tests/cuda_standin.py``), which logs
every stream and event call: the graph is traced with fake CUDA tensors, annotated in PyTorch's
stream IR as Dynamo writes it (stream indices, ``torch.ops.streams`` ops) and lowered as the
backend lowers it. ``cuda``-marked tests run the same on a GPU through ``torch.compile``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of
from tests.cuda_standin import Event, StandInCuda, Stream
from torch.fx.experimental.proxy_tensor import make_fx

from airstream import torch_internals
from airstream.graph.streams import assign_streams
from airstream.ops.torch_streams import TorchStreams
from airstream.ops.torch_streams import torch_streams_of as torch_streams_table
from airstream.runtime.cuda import CudaExecutor
from airstream.runtime.cuda_graphs import CudaGraphExecutor, capture_blockers
from airstream.runtime.torch_streams import TorchStreamObjects
from airstream.schedule.plan import build_plan
from airstream.schedule.torch_streams import lower_torch_streams
from airstream.torch_internals import FakeTensorMode

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

aten = torch.ops.aten
CUDA0 = torch.device("cuda", 0)
MAIN, ALT, EV, OUTSIDE = 0, 1, 2, 3  # registry indices, as Dynamo numbers the objects


def _model(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a = torch.mm(x, w)
    b = torch.mm(w, x).relu()  # on the user's alt stream
    return a + b


def _table() -> TorchStreams:
    return TorchStreams(
        labels={MAIN: None, ALT: "alt"},
        events={EV, OUTSIDE},
        devices=dict.fromkeys((MAIN, ALT, EV, OUTSIDE), "cuda"),
        names={MAIN: "main", ALT: "alt", EV: "ev", OUTSIDE: "outside"},
    )


def _native_graph(synchronize: bool = False) -> torch.fx.GraphModule:
    """``_model`` as Dynamo writes it with ``with alt: outside.wait(); b = ...; ev.record()``
    and ``ev.wait(main)`` before the sum (``ev.synchronize()`` after it, if asked)."""
    with FakeTensorMode():
        fakes = [torch.empty(4, 4, device=CUDA0), torch.empty(4, 4, device=CUDA0)]
    gm = make_fx(_model, tracing_mode="fake")(*fakes)
    graph = gm.graph
    mm_1, relu, add = (n for n in graph.nodes if n.name in ("mm_1", "relu", "add"))
    op = torch_internals.streams_op
    for node in (mm_1, relu):
        torch_internals.set_dynamo_stream_index(node, ALT)
    with graph.inserting_before(mm_1):
        waited = graph.call_function(op("wait_event"), (OUTSIDE, ALT))
    torch_internals.set_dynamo_stream_index(waited, ALT)
    with graph.inserting_after(relu):
        recorded = graph.call_function(op("record_event"), (EV, ALT))
    torch_internals.set_dynamo_stream_index(recorded, ALT)
    with graph.inserting_before(add):
        graph.call_function(op("wait_event"), (EV, MAIN))
    if synchronize:
        with graph.inserting_after(add):
            graph.call_function(op("synchronize_event"), (EV,))
    gm.recompile()
    lower_torch_streams(gm, _table())
    return gm


def _executor(api: StandInCuda, gm: torch.fx.GraphModule) -> tuple[CudaExecutor, dict[int, Any]]:
    objects: dict[int, Any] = {
        ALT: Stream(api, "alt", 0),
        EV: Event(api, "user_ev"),
        OUTSIDE: Event(api, "outside_ev"),
    }
    native = TorchStreamObjects(_table(), resolve=objects.__getitem__)
    plan = build_plan(gm, assign_streams(gm))
    return CudaExecutor(gm, plan, CUDA0, api=api, native=native), objects


def test_side_work_runs_on_the_users_stream_and_records_the_users_event() -> None:
    api = StandInCuda()
    gm = _native_graph()
    executor, objects = _executor(api, gm)
    assert executor.side_streams(capturing=False) == [objects[ALT]]
    caller = api.current_stream(CUDA0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    api.log.clear()
    assert_same(executor([x, w]), _model(x, w))
    log = api.log
    uses = [e[1] for e in log if e[0] == "use"]
    assert "alt" in uses and uses[-1] == caller.name
    assert not {u for u in uses if u not in ("alt", caller.name)}, uses  # no stream of our own
    # forked from the caller's stream, the outside event waited for on alt, ev recorded on alt
    first_wait = next(e for e in log if e[0] == "wait_event")
    assert first_wait[1] == "alt" and first_wait[2] != "outside_ev"  # the fork comes first
    assert ("wait_event", "alt", "outside_ev") in log
    assert ("record", "alt", "user_ev") in log
    # main waits for alt through airstream's own event (the plan's), not the user's
    assert not [e for e in log if e[0] == "wait_event" and e[2] == "user_ev"]
    assert api.current_stream(CUDA0) is caller


def test_each_call_runs_on_the_objects_the_caller_passes() -> None:
    """The objects are read per call (Dynamo's bytecode stores the caller's objects before each
    call; the model may hand in another stream)."""
    api = StandInCuda()
    gm = _native_graph()
    executor, objects = _executor(api, gm)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    executor([x, w])
    objects[ALT] = Stream(api, "alt_again", 0)
    api.log.clear()
    assert_same(executor([x, w]), _model(x, w))
    uses = {e[1] for e in api.log if e[0] == "use"}
    assert "alt_again" in uses and "alt" not in uses


def test_reduce_overhead_waits_and_records_the_users_events_around_the_replay() -> None:
    """Inside the capture the user's objects are not touched (private streams); the replay
    stands for the whole call: the caller's stream waits for the outside event before it and
    records the user's event after it."""
    api = StandInCuda()
    gm = _native_graph()
    inner, _ = _executor(api, gm)
    executor = CudaGraphExecutor(inner, gm)
    assert executor.blockers == []
    caller = api.current_stream(CUDA0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    executor([x, w])  # warm-up and capture
    begin = next(i for i, e in enumerate(api.log) if e[0] == "capture_begin")
    end = next(i for i, e in enumerate(api.log) if e[0] == "capture_end")
    inside = api.log[begin:end]
    assert not [e for e in inside if "user_ev" in e or "outside_ev" in e or "alt" in e]
    api.log.clear()
    executor([x, w])
    kinds = [(e[0], e[1], e[2] if len(e) > 2 else None) for e in api.log]
    replay = next(i for i, e in enumerate(kinds) if e[0] == "replay")
    assert ("wait_event", caller.name, "outside_ev") in kinds[:replay]
    assert ("record", caller.name, "user_ev") in kinds[replay:]


@pytest.mark.skipif(
    torch_internals.torch_release()[:2] < (2, 13),
    reason="torch 2.11 has no torch.ops.streams.synchronize_event (Dynamo writes a method call "
    "there; its lowering is tested on CPU by tests/test_torch_streams.py)",
)
def test_a_host_synchronize_keeps_the_graph_from_capture() -> None:
    gm = _native_graph(synchronize=True)
    assert any("synchronize" in reason for reason in capture_blockers(gm))
    api = StandInCuda()
    executor, _ = _executor(api, gm)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    api.log.clear()
    assert_same(executor([x, w]), _model(x, w))
    assert ("synchronize", "user_ev") in api.log


# ---- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_native_side_stream_is_the_models_own(mode: str) -> None:
    alt = torch.cuda.Stream()
    done = torch.cuda.Event(enable_timing=True)
    start = torch.cuda.Event(enable_timing=True)

    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = torch.nn.Linear(256, 256)
            self.routed = torch.nn.Linear(256, 256)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            current = torch.cuda.current_stream()
            alt.wait_stream(current)
            with alt:
                shared = self.shared(x).relu()
                done.record()
            routed = self.routed(x).relu()
            current.wait_stream(alt)
            return shared + routed

    model = Shared().cuda().eval()
    compiled, backend = compile_model(model, mode=mode)
    x = torch.randn(64, 256, device="cuda")
    with torch.no_grad():
        want = model.shared(x).relu() + model.routed(x).relu()
        for _ in range(3):
            start.record(alt)
            assert_same(compiled(x), want, rtol=1e-4, atol=1e-4)
    torch.cuda.synchronize()
    assert start.elapsed_time(done) >= 0.0  # raises if the user's event was never recorded
    graph = graph_of(backend, "inference")
    inner = getattr(graph.executor, "inner", graph.executor)
    if mode == "default":
        (side,) = inner.side_streams(capturing=False)
        assert side.cuda_stream == alt.cuda_stream


def test_the_serving_moe_block_runs_its_side_on_the_users_stream_on_the_standin(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shared-expert block as serving stacks write it (selftest/alt_stream.py), compiled
    through Dynamo, then issued by the CUDA runtime with the stand-in as the model's CUDA
    stream: its shared expert is issued on the model's stream object, and the result is eager's."""
    from airstream.selftest.alt_stream import AltStreamMoe
    from airstream.selftest.architectures import ARCHS

    model = ARCHS["qwen2_moe_alt"].build()
    block = next(m for m in model.modules() if isinstance(m, AltStreamMoe))
    compiled, backend = compile_model(block)
    hidden = torch.randn(1, 6, 64)
    with torch.no_grad():
        want = block.block(hidden)  # the block in one piece
        assert_same(compiled(hidden), want, rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    runs = type(graph.executor).__call__
    args_seen: list[list[Any]] = []

    def seen(self: Any, args: list[Any]) -> Any:  # the arguments AOTAutograd passes
        args_seen.append(list(args))
        return runs(self, args)

    monkeypatch.setattr(type(graph.executor), "__call__", seen)
    with torch.no_grad():
        compiled(hidden)
    (args,) = args_seen
    table = TorchStreams(
        labels=dict(torch_streams_table(graph.graph_module).labels),
        devices=dict.fromkeys(torch_streams_table(graph.graph_module).devices, "cuda"),
        names=dict(torch_streams_table(graph.graph_module).names),
    )
    api = StandInCuda()
    theirs = Stream(api, "models_alt_stream", 0)
    (index,) = table.torch_stream_labels.values()
    native = TorchStreamObjects(table, resolve={index: theirs}.__getitem__)
    executor = CudaExecutor(graph.graph_module, graph.plan, CUDA0, api=api, native=native)
    with torch.no_grad():
        got = executor(args)
    assert_same(got[0], want, rtol=1e-5, atol=1e-5)
    uses = [e[1] for e in api.log if e[0] == "use"]
    assert "models_alt_stream" in uses


def test_waiting_for_a_users_stream_that_runs_nothing_in_the_graph_still_waits() -> None:
    """``current.wait_stream(copy)`` where ``copy`` only ran work before the call (a
    non_blocking copy): the caller's stream waits for the user's stream itself."""
    with FakeTensorMode():
        fakes = [torch.empty(4, 4, device=CUDA0), torch.empty(4, 4, device=CUDA0)]
    gm = make_fx(_model, tracing_mode="fake")(*fakes)
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_before(first):
        gm.graph.call_function(torch_internals.streams_op("wait_stream"), (MAIN, ALT))
    gm.recompile()
    lower_torch_streams(gm, _table())
    api = StandInCuda()
    executor, _ = _executor(api, gm)
    caller = api.current_stream(CUDA0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    api.log.clear()
    assert_same(executor([x, w]), _model(x, w))
    assert ("wait_stream", caller.name, "alt") in api.log
    assert executor.side_streams(capturing=False) == []  # alt runs nothing: no fork, no join


def test_a_backward_graph_finds_the_forward_calls_objects() -> None:
    """Backward graphs run outside Dynamo's bytecode: they use the objects the last forward
    call used, else the ones seen at compile time (held, so they outlive Dynamo's own list)."""
    table = _table()
    compiled_with = Stream(StandInCuda(), "alt_at_compile", 0)
    table.objects[ALT] = compiled_with
    backward = TorchStreamObjects(table, at_run_time=False)
    assert backward.get(ALT) is compiled_with
    table.seen[ALT] = forward_call = Stream(StandInCuda(), "alt_this_call", 0)
    assert backward.get(ALT) is forward_call
