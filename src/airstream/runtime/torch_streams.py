"""The user's own CUDA streams and events in a compiled call (PyTorch's stream IR on CUDA).

A graph's side stream that stands for a ``torch.Stream`` of the model runs on that object, so
code outside the compiled region that synchronizes with it (``alt_stream.synchronize()``, an
event recorded on it) stays right. The ``air.native_*`` steps (``ops/torch_streams.py``) act on the
user's events and streams. Which objects: for an inference or forward graph, the ones Dynamo's
bytecode stored for this call (the caller's, as torch itself reads them); for a backward graph,
which runs outside that bytecode, the ones seen when the graph compiled.

Inside airstream's own CUDA graph capture the user's objects are not touched: side work runs on
the capturing thread's private streams (a stream another thread may use must never join a
capture), and the replay stands for the whole call (:class:`TorchStreamsAround`): the caller's
stream waits, before the replay, for the user's events the call waits for (recorded outside the
graph) and for the user's streams its side work runs on (as that work would have queued behind
theirs); after it, the user's events the call records are recorded on the caller's stream and
those streams wait for the caller's, so code after the call that waits for or synchronizes one
of them sees the call's work, as it would without capture. Inside the user's own capture the
call acts on the user's objects as eager code does (``runtime/cuda.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.ops.torch_streams import (
    TorchStreams,
    native_device_synchronize,
    native_event_record,
    native_event_synchronize,
    native_event_wait,
    native_record_stream,
    native_stream_synchronize,
    native_wait_stream,
)

__all__ = ["TorchStreamsAround", "TorchStreamObjects", "torch_stream_step"]


@dataclass(frozen=True)
class TorchStreamObjects:
    """Where a CUDA executor finds the user's streams and events for a call: ``table`` names
    them; ``at_run_time`` reads the objects Dynamo stored for the call in progress (inference
    and forward graphs), else those of compile time (backward). ``resolve`` replaces both (the
    tests' stand-in objects)."""

    table: TorchStreams
    at_run_time: bool = True
    resolve: Callable[[int], Any] | None = None

    def get(self, index: int) -> Any:
        """The object at registry ``index`` for this call: the caller's (inference and forward
        graphs; remembered for the backward), else the forward's last, else compile time's."""
        if self.resolve is not None:
            return self.resolve(index)
        if self.at_run_time:
            value = torch_internals.torch_stream_object_at_run_time(index)
            self.table.seen[index] = value
            return value
        return self.table.seen.get(index, self.table.compile_time_object(index))

    def for_call(self, indices: Sequence[int]) -> dict[int, Any]:
        """Every object a call needs, read once at its start (Dynamo's registry is the
        process's: read step by step, another thread's call could change it in between)."""
        return {index: self.get(index) for index in indices}

    def side_labels(self, labels: Sequence[str | None], device: str = "cuda") -> dict[str, int]:
        """Of ``labels``, those that stand for a user's stream on ``device``'s type, with its
        registry index (a CPU stream in a CUDA graph runs on airstream's stream for its label)."""
        native = self.table.torch_stream_labels
        return {
            str(label): native[label]
            for label in labels
            if label in native and self.table.device(native[label]) == device
        }


# -- the steps ------------------------------------------------------------------------------------
# Each runs from the issuing thread with the call's streams; ``natives`` is None while the
# caller's stream captures a CUDA graph (the replay's caller does their work; see
# TorchStreamsAround).


def _event_record(natives: Any, stream: Any, event: int) -> None:
    if natives is not None:
        natives(event).record(stream)


def _event_wait(natives: Any, stream: Any, event: int) -> None:
    if natives is not None:
        stream.wait_event(natives(event))


def _event_synchronize(natives: Any, stream: Any, event: int) -> None:
    if natives is not None:
        natives(event).synchronize()


def _wait_stream(natives: Any, stream: Any, api: Any, index: int) -> None:
    if natives is not None:
        stream.wait_stream(api.adopt_stream(natives(index)))


def _stream_synchronize(natives: Any, stream: Any, index: int) -> None:
    if natives is not None:
        natives(index).synchronize()


def _device_synchronize(natives: Any, stream: Any, api: Any) -> None:
    if natives is not None:
        api.synchronize_device()


def _record_stream(natives: Any, stream: Any, api: Any, tensor: Any, index: int) -> None:
    if natives is not None:
        api.keep(tensor, api.adopt_stream(natives(index)))


_STEPS: dict[Any, Callable[..., None]] = {
    native_event_record: _event_record,
    native_event_wait: _event_wait,
    native_event_synchronize: _event_synchronize,
    native_wait_stream: _wait_stream,
    native_stream_synchronize: _stream_synchronize,
    native_device_synchronize: _device_synchronize,
    native_record_stream: _record_stream,
}


def torch_stream_step(node: torch.fx.Node) -> tuple[Callable[..., None], bool] | None:
    """The function that runs ``node`` (an ``air.native_*`` step) and whether it takes the
    CudaApi before its arguments; None for any other node."""
    fn = _STEPS.get(node.target)
    if fn is None:
        return None
    return fn, node.target in (native_device_synchronize, native_record_stream, native_wait_stream)


class TorchStreamsAround:
    """What a replayed CUDA graph does with the user's events and streams: before the replay the
    caller's stream waits for the events the call waits for (recorded outside the graph), the
    user's streams it waits for and the user's streams its side work runs on (``sides``: their
    registry indices); after it, the events the call records are recorded on the caller's stream
    and those side streams wait for it."""

    def __init__(self, gm: torch.fx.GraphModule, sides: Sequence[int] = ()) -> None:
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        self.waits = [int(n.args[0]) for n in nodes if n.target is native_event_wait]
        self.stream_waits = [int(n.args[0]) for n in nodes if n.target is native_wait_stream]
        self.records = [int(n.args[0]) for n in nodes if n.target is native_event_record]
        self.sides = list(sides)

    def __bool__(self) -> bool:
        return bool(self.waits or self.stream_waits or self.records or self.sides)

    def before(self, objects: Mapping[int, Any], stream: Any, api: Any) -> None:
        for index in self.waits:
            stream.wait_event(objects[index])
        for index in (*self.stream_waits, *self.sides):
            stream.wait_stream(api.adopt_stream(objects[index]))

    def after(self, objects: Mapping[int, Any], stream: Any, api: Any) -> None:
        for index in self.records:
            objects[index].record(stream)
        for index in self.sides:
            api.adopt_stream(objects[index]).wait_stream(stream)
