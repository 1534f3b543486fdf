"""Native streams: the ``torch.Stream`` / ``torch.Event`` objects a compiled graph uses, and the
``air`` ops that act on them.

A Dynamo graph names each stream and event by an index into Dynamo's registry of the objects it
uses (:mod:`airstream.torch_internals.streams`). :class:`TorchStreams` is that table as
airstream reads it while the graph compiles: each stream's airstream label (the variable the model
used, ``alt_stream``; the caller's current stream is the main stream, label ``None``), each
object's device, and, on CUDA, how to find the caller's own object for a call.

Ordering between streams becomes airstream's own ``record``/``wait``
(``schedule/torch_streams.py``). What only the user's own objects can do is left as one of the ops
below, kept in place on its stream like TorchAir's tagged events: recording the user's event so that
code outside the compiled region sees it, waiting for an event recorded outside it, the host
synchronizes and ``record_stream``. They act on CUDA objects only; for CPU objects the lowering
never emits them (the host runs everything before the call, and a CPU tensor's memory is kept by its
references).

    air::native_event_record(int event) -> ()        # record the user's event here
    air::native_event_wait(int event) -> ()          # this stream waits for it
    air::native_event_synchronize(int event) -> ()   # the host waits for it
    air::native_wait_stream(int stream) -> ()        # this stream waits for the user's stream
    air::native_stream_synchronize(int stream) -> () # the host waits for the user's stream
    air::native_device_synchronize() -> ()           # the host waits for the device
    air::native_record_stream(Tensor t, int stream) -> ()  # Tensor.record_stream

The CUDA runtime issues them on the call's streams itself. Their kernels, which the serial and
data-dump executors (``debug.run_eagerly``, ``debug.data_dump``) run in program order on the
caller's stream, do the same with the objects Dynamo stored for the call in progress.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.node import has_side_effect

from airstream import torch_internals
from airstream.ops.stream import eager_under_torch_compile

__all__ = [
    "CPU_STREAM_HOME",
    "NATIVE_HOST_SYNCS",
    "NATIVE_OPS",
    "TORCH_STREAM_ANNOTATION",
    "attach_torch_streams",
    "drop_torch_stream_index",
    "torch_streams_of",
    "torch_stream_index",
    "CpuEvent",
    "CpuStream",
    "TorchStreams",
    "current_stream",
    "native_device_synchronize",
    "native_event_record",
    "native_event_synchronize",
    "native_event_wait",
    "native_record_stream",
    "native_stream_synchronize",
    "native_wait_stream",
]

_lib = torch.library.Library("air", "FRAGMENT")
_SCHEMAS = {
    "native_event_record": "native_event_record(int event) -> ()",
    "native_event_wait": "native_event_wait(int event) -> ()",
    "native_event_synchronize": "native_event_synchronize(int event) -> ()",
    "native_wait_stream": "native_wait_stream(int stream) -> ()",
    "native_stream_synchronize": "native_stream_synchronize(int stream) -> ()",
    "native_device_synchronize": "native_device_synchronize() -> ()",
    "native_record_stream": "native_record_stream(Tensor t, int stream) -> ()",
}


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _object(index: int) -> Any:
    return torch_internals.torch_stream_object_at_run_time(index)


def _current() -> Any:
    return torch.accelerator.current_stream()


_KERNELS: dict[str, Any] = {  # in program order on the caller's current stream
    "native_event_record": lambda event: _object(event).record(_current()),
    "native_event_wait": lambda event: _object(event).wait(_current()),
    "native_event_synchronize": lambda event: _object(event).synchronize(),
    "native_wait_stream": lambda stream: _current().wait_stream(_object(stream)),
    "native_stream_synchronize": lambda stream: _object(stream).synchronize(),
    "native_device_synchronize": lambda: torch.accelerator.synchronize(),
    "native_record_stream": lambda t, stream: t.record_stream(_object(stream)),
}

for _name, _schema in _SCHEMAS.items():
    _lib.define(_schema)
    _lib.impl(_name, _KERNELS[_name], "CompositeExplicitAutograd")
    torch.library.register_fake(f"air::{_name}", _nothing, lib=_lib)

native_event_record = torch.ops.air.native_event_record.default
native_event_wait = torch.ops.air.native_event_wait.default
native_event_synchronize = torch.ops.air.native_event_synchronize.default
native_wait_stream = torch.ops.air.native_wait_stream.default
native_stream_synchronize = torch.ops.air.native_stream_synchronize.default
native_device_synchronize = torch.ops.air.native_device_synchronize.default
native_record_stream = torch.ops.air.native_record_stream.default
NATIVE_OPS = frozenset(
    {
        native_event_record,
        native_event_wait,
        native_event_synchronize,
        native_wait_stream,
        native_stream_synchronize,
        native_device_synchronize,
        native_record_stream,
    }
)
NATIVE_HOST_SYNCS = frozenset(
    {native_event_synchronize, native_stream_synchronize, native_device_synchronize}
)
for _op in NATIVE_OPS:
    has_side_effect(_op)


# ---- the annotation ------------------------------------------------------------------------------

# node.meta["custom"] key: the registry index of the torch stream a node was traced under. The
# backend moves Dynamo's own key here before AOTAutograd (which would act on Dynamo's); passes
# may write either.
TORCH_STREAM_ANNOTATION = "air_torch_stream"


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def torch_stream_index(node: torch.fx.Node) -> int | None:
    """The registry index of the torch stream ``node`` was traced under, or None."""
    custom = torch_internals.stream_annotations(node)
    found = _index(custom.get(TORCH_STREAM_ANNOTATION))
    return found if found is not None else torch_internals.dynamo_stream_index(node)


def drop_torch_stream_index(node: torch.fx.Node) -> None:
    """Remove the torch stream index ``node`` was traced under (airstream's key and Dynamo's)."""
    custom = torch_internals.stream_annotations(node)
    if TORCH_STREAM_ANNOTATION in custom:
        torch_internals.set_annotations(
            node, {k: v for k, v in custom.items() if k != TORCH_STREAM_ANNOTATION}
        )
    torch_internals.set_dynamo_stream_index(node, None)


# ---- CPU streams eager code can order -------------------------------------------------------


class CpuStream(torch.Stream):
    """A ``torch.Stream`` on the CPU whose ordering calls work in eager code too. Eager
    PyTorch refuses them on CPU ("cpu backend doesn't support events"), yet eager CPU work runs
    in program order on the calling thread, so there is nothing to wait for: ``wait_stream``,
    ``wait_event`` and ``synchronize`` return at once. Compiled code uses it as any
    ``torch.Stream`` (make it outside the compiled function: Dynamo cannot trace the subclass's
    construction)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> CpuStream:
        return super().__new__(cls, device="cpu")

    def __enter__(self) -> Any:
        if eager_under_torch_compile():  # Dynamo traces the block; this is eager code
            warnings.warn(
                "airstream: a torch.Stream block ran eagerly inside a torch.compile'd call: "
                "Dynamo fell back to eager for this frame, usually because of a graph break "
                "inside the block (torch cannot yet resume inside a stream block), so its ops "
                "run without streams. Compile with fullgraph=True to see the break, and move it "
                "out of the block.",
                stacklevel=2,
            )
        return super().__enter__()

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuEvent(torch.Event):
    """A ``torch.Event`` on the CPU whose calls work in eager code (see :class:`CpuStream`)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> CpuEvent:
        return super().__new__(cls, device="cpu")

    def record(self, stream: Any = None) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


# ---- the caller's current stream on CPU ---------------------------------------------------------

_cpu_current = CpuStream()
CPU_STREAM_HOME = (__name__, "_cpu_current")  # where compiled bytecode loads it from


def current_stream(device: torch.device | str | None = None) -> torch.Stream:
    """The caller's current stream on ``device`` (default: the accelerator's, else CPU), as a
    ``torch.Stream`` compiled code can use in ``wait_stream``/``Event.record``.

    On CUDA (or any accelerator) this is ``torch.accelerator.current_stream()``. CPU has one
    stream in eager PyTorch and no such call that Dynamo traces, so airstream gives it one object
    that stands for the main stream: ``side.wait_stream(airstream.current_stream("cpu"))`` is the
    CPU spelling of ``side.wait_stream(torch.cuda.current_stream())``. It is a
    :class:`CpuStream`: eager code may call its ordering methods too."""
    dev = torch.device(device) if device is not None else None
    if dev is None and torch.accelerator.is_available():
        return torch.accelerator.current_stream()
    if dev is not None and dev.type != "cpu":
        return torch.accelerator.current_stream(dev)
    return _cpu_current


# ---- the table ---------------------------------------------------------------------------------


def _device_type(value: Any) -> str:
    device = getattr(value, "device", None)
    return str(getattr(device, "type", device or "cpu"))


@dataclass
class TorchStreams:
    """The streams and events of one Dynamo graph (shared by its forward and backward graphs):
    registry index -> airstream label for streams (None: the main stream), the device type of each
    object, and the source the model read it from. Built while the graph compiles
    (:meth:`from_registry`); an index a pass registers later is added on first lookup."""

    labels: dict[int, str | None] = field(default_factory=dict)
    events: set[int] = field(default_factory=set)
    devices: dict[int, str] = field(default_factory=dict)
    sources: dict[int, str | None] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    # the objects themselves: a stream the compiled code made is held only by Dynamo's
    # keep-alive list, which the next frame's compile clears, and a backward graph needs it
    objects: dict[int, Any] = field(default_factory=dict, repr=False)
    seen: dict[int, Any] = field(default_factory=dict, repr=False)  # the last forward call's
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_registry(cls) -> TorchStreams:
        """The objects Dynamo's registry holds now (while a graph compiles)."""
        table = cls()
        table._add(torch_internals.torch_stream_objects())
        return table

    def _add(self, found: Mapping[int, torch_internals.TorchStreamObject]) -> None:
        taken = {label for label in self.labels.values() if label is not None}
        for index in sorted(found):
            if index in self.devices:
                continue
            obj = found[index]
            value = obj.value
            self.devices[index] = _device_type(value)
            self.sources[index] = obj.source
            self.objects[index] = value
            is_event = isinstance(value, torch.Event) or type(value).__name__ == "Event"
            main = not is_event and (obj.current or value is _cpu_current)
            if main:  # the caller's current stream: airstream's main stream
                self.names[index] = "main"
                self.labels[index] = None
                continue
            base = torch_internals.readable_name(obj.source) or (
                f"{'event' if is_event else 'stream'}#{index}"
            )
            name, n = base, 2
            while name in taken:
                name, n = f"{base}_{n}", n + 1
            self.names[index] = name
            taken.add(name)
            if is_event:
                self.events.add(index)
            else:
                self.labels[index] = name

    def _refresh(self, index: int) -> None:
        with self._lock:
            if index not in self.devices:
                self._add(torch_internals.torch_stream_objects())
        if index not in self.devices:
            raise KeyError(
                f"airstream: no stream or event at index {index} of Dynamo's registry; native "
                "stream indices come from Dynamo (with stream:) or "
                "torch_internals.new_torch_stream"
            )

    def is_stream(self, index: int) -> bool:
        if index not in self.devices:
            self._refresh(index)
        return index in self.labels

    def label(self, index: int) -> str | None:
        """The airstream label of the stream at ``index`` (None: the main stream)."""
        if index not in self.devices:
            self._refresh(index)
        if index not in self.labels:
            raise KeyError(
                f"airstream: index {index} of Dynamo's registry is an event, not a stream"
            )
        return self.labels[index]

    def device(self, index: int) -> str:
        """The device type (``cpu``, ``cuda``) of the stream or event at ``index``."""
        if index not in self.devices:
            self._refresh(index)
        return self.devices[index]

    def name(self, index: int) -> str:
        """A readable name for the object at ``index``: its variable, else ``stream<i>``."""
        if index not in self.devices:
            self._refresh(index)
        return self.names[index]

    def compile_time_object(self, index: int) -> Any:
        """The object at ``index`` when the graph compiled."""
        return self.objects.get(index)

    @property
    def torch_stream_labels(self) -> dict[str, int]:
        """Side-stream label -> registry index (what the CUDA runtime resolves per call)."""
        return {label: i for i, label in self.labels.items() if label is not None}


_TABLE_KEY = "air_torch_streams"  # GraphModule.meta key: the graph's TorchStreams


def attach_torch_streams(gm: torch.fx.GraphModule, table: TorchStreams) -> None:
    """Give ``gm`` its Dynamo graph's table (stream analysis reads it from there)."""
    gm.meta[_TABLE_KEY] = table


def torch_streams_of(gm: torch.fx.GraphModule) -> TorchStreams | None:
    """The table attached to ``gm``, or None."""
    table = gm.meta.get(_TABLE_KEY)
    return table if isinstance(table, TorchStreams) else None
