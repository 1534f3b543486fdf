"""Tagged events: TorchAir's process-wide named events, and the ``air`` ops that use them.

``air::tagged_event_record(str tag, bool created_inside=False)`` records the event registered
under ``tag`` on the current stream; ``air::tagged_event_wait`` makes the current stream wait for
it; ``air::record_tagged_stream(Tensor input, str tag)`` tells the caching allocator that
``input`` is used on the stream named ``tag``. In eager code these run their kernels. In a
compiled graph, :func:`airstream.passes.tagged_events.lower_tagged_events` turns a wait and the
record before it into airstream's own ``record``/``wait`` pair (an edge the planner sees); an
op with no partner in the graph stays a step and runs its kernel.

Tags live for the whole process (TorchAir has no way to delete one): :func:`create_tagged_event`
refuses a tag in use, and the registry is guarded by a lock.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch.fx.node import has_side_effect

__all__ = [
    "TAGGED_EVENT_OPS",
    "TaggedEvent",
    "create_tagged_event",
    "event_for_tag",
    "stream_for_tag",
    "tag_of",
]

_lock = threading.Lock()
_events: dict[str, TaggedEvent] = {}
_streams: dict[str, Any] = {}


class TaggedEvent:
    """A named event: a CUDA event on a GPU, a host-ordered no-op on CPU (where a compiled
    graph's own record/wait carry the ordering and eager code runs in program order)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.event: Any = torch.cuda.Event() if torch.cuda.is_available() else None

    def record(self, stream: Any = None) -> None:
        if self.event is not None:
            self.event.record(stream if stream is not None else torch.cuda.current_stream())

    def wait(self, stream: Any = None) -> None:
        if self.event is not None:
            self.event.wait(stream if stream is not None else torch.cuda.current_stream())

    def synchronize(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def query(self) -> bool:
        return True if self.event is None else bool(self.event.query())

    def __repr__(self) -> str:
        return f"TaggedEvent(tag={self.tag!r})"


def create_tagged_event(tag: str) -> TaggedEvent:
    """Register a new event under ``tag``; a tag already in use raises ``ValueError``."""
    if not isinstance(tag, str):
        raise TypeError(f"tagged event tag must be a str, got {type(tag).__name__} {tag!r}")
    with _lock:
        if tag in _events:
            raise ValueError(
                f"tagged event tag {tag} is already in use (tags last for the whole process; "
                "choose another tag)"
            )
        event = _events[tag] = TaggedEvent(tag)
    return event


def tag_of(event: object) -> str:
    """The tag ``event`` was created under; an event not made by create_tagged_event raises."""
    tag = event.tag if isinstance(event, TaggedEvent) else None
    # no lock: one dict read is atomic, and Dynamo traces this function (it cannot enter a lock)
    if tag is None or _events.get(tag) is not event:
        raise ValueError(
            f"tagged event {event} is not in use: create it with "
            "torchair.ops.npu_create_tagged_event(tag) first"
        )
    return tag


def event_for_tag(tag: str, op: str) -> TaggedEvent:
    """The event under ``tag`` (for the op named ``op``); an unknown tag raises."""
    with _lock:
        event = _events.get(tag)
    if event is None:
        raise AssertionError(
            f"tagged event is None while tag is {tag}, tagged event {op} failed: create the "
            "event with torchair.ops.npu_create_tagged_event(tag) before the call"
        )
    return event


def stream_for_tag(tag: str) -> Any:
    """The side stream named ``tag`` (made on first use; None without CUDA)."""
    if not torch.cuda.is_available():
        return None
    with _lock:
        if tag not in _streams:
            _streams[tag] = torch.cuda.Stream()
        return _streams[tag]


_lib = torch.library.Library("air", "FRAGMENT")
_lib.define("tagged_event_record(str tag, bool created_inside=False) -> ()")
_lib.define("tagged_event_wait(str tag, bool created_inside=False) -> ()")
_lib.define("record_tagged_stream(Tensor input, str tag) -> ()")


def _record(tag: str, created_inside: bool = False) -> None:
    event_for_tag(tag, "record").record()


def _wait(tag: str, created_inside: bool = False) -> None:
    event_for_tag(tag, "wait").wait()


def _record_stream(input: torch.Tensor, tag: str) -> None:
    if input.is_cuda:
        stream = stream_for_tag(tag)
        if stream is None:
            raise AssertionError(f"get stream with tag = {tag} failed")
        input.record_stream(stream)


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


for _name, _kernel in [
    ("tagged_event_record", _record),
    ("tagged_event_wait", _wait),
    ("record_tagged_stream", _record_stream),
]:
    _lib.impl(_name, _kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"air::{_name}", _nothing, lib=_lib)

tagged_event_record = torch.ops.air.tagged_event_record.default
tagged_event_wait = torch.ops.air.tagged_event_wait.default
record_tagged_stream = torch.ops.air.record_tagged_stream.default
TAGGED_EVENT_OPS = frozenset({tagged_event_record, tagged_event_wait, record_tagged_stream})

for _op in TAGGED_EVENT_OPS:
    has_side_effect(_op)
