"""What each op of PyTorch's stream IR means in airstream's terms, at its place in program order
(the rules are :mod:`airstream.schedule.torch_streams`'): :class:`Lowerer` places the ``record``,
``wait`` and ``native_*`` steps an op stands for on their streams, one handler per op
(:data:`HANDLERS`), and says what it cannot honour; :func:`contexts` finds the air scope each op
sits in.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.errors import StreamError
from airstream.graph.nodes import describe, source_line
from airstream.graph.streams import assign_streams
from airstream.ops.library import (
    STREAM_LABEL_KEY,
    air_op_for,
    record,
    scope_enter,
    scope_exit,
    wait,
)
from airstream.ops.stream import STREAM_ANNOTATION
from airstream.ops.torch_streams import (
    TORCH_STREAM_ANNOTATION,
    TorchStreams,
    native_device_synchronize,
    native_event_record,
    native_event_synchronize,
    native_event_wait,
    native_record_stream,
    native_stream_synchronize,
    native_wait_stream,
    torch_stream_index,
)
from airstream.schedule.torch_stream_forms import (
    TorchStreamOp,
    erase_wrapper,
    replace_results,
)

__all__ = ["HANDLERS", "Context", "Lowerer", "TorchStreamLowering", "contexts"]


@dataclass
class TorchStreamLowering:
    """What :func:`lower_torch_streams` did: ops lowered by name, annotations moved, warnings."""

    ops: dict[str, int] = field(default_factory=dict)
    annotated: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.ops or self.annotated)


@dataclass(frozen=True)
class Context:
    """Where an op sits: the innermost labelled air scope around it, and the torch stream its
    scope_enter was traced under (which decides whether a native annotation inside is inner)."""

    scope: str | None = None
    scope_torch_stream: int | None = None


def contexts(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, Context]:
    """Where each call sits: the innermost labelled air scope around it."""
    stack: list[Context] = []
    found: dict[torch.fx.Node, Context] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        target = air_op_for(node.target) or node.target  # a Dynamo graph's packet too
        if target is scope_exit and stack:
            stack.pop()
        found[node] = stack[-1] if stack else Context()
        if target is scope_enter:
            keys = node.kwargs.get("keys", node.args[0] if node.args else ())
            values = node.kwargs.get("values", node.args[1] if len(node.args) > 1 else ())
            attrs = dict(zip(keys or (), values or (), strict=False))
            label = attrs.get(STREAM_LABEL_KEY)
            outer = stack[-1] if stack else Context()
            stack.append(Context(str(label), torch_stream_index(node)) if label else outer)
    return found


class Lowerer:
    """The lowering of one graph's ops: the nodes it adds, the events' last records, its report."""

    def __init__(self, gm: torch.fx.GraphModule, table: TorchStreams, kind: str) -> None:
        self.gm, self.graph, self.table, self.kind = gm, gm.graph, table, kind
        self.report = TorchStreamLowering()
        self.last_record: dict[int, torch.fx.Node] = {}
        self.main_index = next((i for i, label in table.labels.items() if label is None), None)

    # -- placing a new node on a stream at an op's place ------------------------------------------

    def _new(
        self,
        op: TorchStreamOp,
        target: Any,
        args: tuple[Any, ...],
        label: str | None,
        index: int | None,
        context: Context,
    ) -> torch.fx.Node:
        """A call of ``target`` just before ``op``'s node, running on stream ``label`` (native
        registry ``index``, when it has one)."""
        graph = self.graph
        custom: dict[str, Any] = {}
        wrap = False
        if context.scope is None:
            if index is not None:
                custom[TORCH_STREAM_ANNOTATION] = index
            elif label is not None:
                custom[STREAM_ANNOTATION] = label
        elif index is not None and index != context.scope_torch_stream:
            custom[TORCH_STREAM_ANNOTATION] = index
        elif label == context.scope:
            pass
        elif label is not None:
            wrap = True
        elif self.main_index is not None and self.main_index != context.scope_torch_stream:
            custom[TORCH_STREAM_ANNOTATION] = self.main_index
        else:
            self._warn(
                op,
                f"it acts on the main stream inside airstream's stream scope {context.scope!r}, "
                f"where airstream cannot place it on main; it runs on {context.scope!r}",
            )
        with graph.inserting_before(op.anchor):
            if wrap:
                graph.call_function(scope_enter, ([STREAM_LABEL_KEY], [label]))
            node = graph.call_function(target, args)
            if wrap:
                graph.call_function(scope_exit, ())
        torch_internals.copy_trace_meta(op.anchor, node)
        if custom:
            torch_internals.set_annotations(node, custom)
        node.meta["air_torch_stream_op"] = op.name
        return node

    def _stream(self, op: TorchStreamOp, index: Any) -> tuple[str | None, int]:
        if not isinstance(index, int) or not self.table.is_stream(index):
            what = "an event" if isinstance(index, int) else repr(index)
            raise StreamError(
                f"{describe(op.anchor)} in the {self.kind} graph: {op.name} needs a stream, got "
                f"{what} (registry index {index})"
            )
        return self.table.label(index), index

    def _event(self, op: TorchStreamOp, index: Any) -> int:
        if not isinstance(index, int) or self.table.is_stream(index):
            raise StreamError(
                f"{describe(op.anchor)} in the {self.kind} graph: {op.name} needs an event, got a "
                f"stream (registry index {index})"
            )
        return index

    def _on_device(self, index: int) -> bool:
        """Is the object at ``index`` on an accelerator (where the user's own object acts)?"""
        return self.table.device(index) != "cpu"

    def _warn(self, op: TorchStreamOp, what: str) -> None:
        line = source_line(op.anchor)
        where = f" at {line}" if line else ""
        message = f"airstream: {op.name}{where} in the {self.kind} graph: {what}"
        self.report.warnings.append(message)
        warnings.warn(message, stacklevel=2)

    # -- the ops ---------------------------------------------------------------------------------

    def lower(self, ops: Sequence[TorchStreamOp], contexts: dict[torch.fx.Node, Context]) -> None:
        streams = None
        for op in ops:
            context = contexts.get(op.anchor, Context())
            name = op.name
            if name.startswith("synchronize") and streams is None:
                streams = assign_streams(self.gm)
            if not op.supported:
                self._warn(
                    op,
                    "airstream does not support this stream method in compiled code; "
                    "it is left out (use Event.record/wait and Stream.wait_stream)",
                )
            else:
                HANDLERS[name](self, op, context, streams)
            self.report.ops[name] = self.report.ops.get(name, 0) + 1
            if op.returned is not None:  # read again: an earlier wrapper's results it passed
                parts = torch_internals.control_deps_parts(self.gm, op.anchor)  # on are gone
                replace_results(op.anchor, dict(parts.returned) if parts else {}, None)
                erase_wrapper(self.gm, op.anchor)
            else:
                self.graph.erase_node(op.anchor)

    def _current(self, op: TorchStreamOp, index: Any) -> Any:
        """torch 2.11's ``Event.record()``/``wait()`` without a stream: the block's stream."""
        if index is not None:
            return index
        traced = torch_stream_index(op.anchor)
        return traced if traced is not None else self.main_index

    def _record_event(self, op: TorchStreamOp, context: Context, _: Any) -> None:
        event = self._event(op, op.args[0])
        label, index = self._stream(op, self._current(op, op.args[1]))
        if self._on_device(event):  # a step: the stream runs something even if nothing else
            self._new(op, native_event_record, (event,), label, index, context)
        self.last_record[event] = self._new(op, record, (), label, index, context)

    def _wait_event(self, op: TorchStreamOp, context: Context, _: Any, hold: Any = None) -> None:
        event = self._event(op, op.args[0])
        label, index = self._stream(op, self._current(op, op.args[1]))
        token = self.last_record.get(event)
        held = [hold] if isinstance(hold, torch.fx.Node) else []
        if token is not None:
            self._new(op, wait, ([token, *held],), label, index, context)
            return
        if self._on_device(event):
            self._new(op, native_event_wait, (event,), label, index, context)
        if held:
            self._new(op, wait, (held,), label, index, context)
        if self._recorded_later(op, event):
            self._warn(
                op,
                f"it waits for event {self.table.name(event)!r}, which this graph records only "
                "later: on CUDA it waits for that event's previous record (an earlier call's), "
                "which airstream's runtime has completed when this call starts, so it waits for "
                "nothing. Record the event before waiting for it.",
            )

    def _sync_dealloc(self, op: TorchStreamOp, context: Context, streams: Any) -> None:
        self._wait_event(op, context, streams, hold=op.args[2] if len(op.args) > 2 else None)

    def _wait_stream(self, op: TorchStreamOp, context: Context, _: Any) -> None:
        waiting_label, waiting = self._stream(op, op.args[0])
        waited_label, waited = self._stream(op, op.args[1])
        if waiting_label == waited_label:
            return  # a stream is always after its own earlier work
        token = self._new(op, record, (), waited_label, waited, context)
        self._new(op, wait, ([token],), waiting_label, waiting, context)
        if self._on_device(waited):  # also the user's stream's work issued before the call
            self._new(op, native_wait_stream, (waited,), waiting_label, waiting, context)

    def _record_stream(self, op: TorchStreamOp, context: Context, _: Any) -> None:
        tensor, stream = op.args[0], op.args[1]
        _, index = self._stream(op, stream)
        if self._on_device(index):
            node = self._new(op, native_record_stream, (tensor, index), None, None, Context())
            torch_internals.set_annotations(node, torch_internals.stream_annotations(op.anchor))

    def _fork(self, op: TorchStreamOp, context: Context, _: Any) -> None:
        """A switch of the current stream: the annotations already place each node."""

    def _synchronize_event(self, op: TorchStreamOp, context: Context, streams: Any) -> None:
        event = self._event(op, op.args[0])
        token = self.last_record.get(event)
        if token is not None:
            self._barrier(op, context, streams, [token])
        if self._on_device(event):
            self._new(op, native_event_synchronize, (event,), None, self.main_index, context)

    def _synchronize_stream(self, op: TorchStreamOp, context: Context, streams: Any) -> None:
        label, index = self._stream(op, op.args[0])
        token = self._new(op, record, (), label, index, context)
        self._barrier(op, context, streams, [token], skip=(label,))
        if self._on_device(index):
            self._new(op, native_stream_synchronize, (index,), None, self.main_index, context)

    def _synchronize_device(self, op: TorchStreamOp, context: Context, streams: Any) -> None:
        labels = self._labels_before(op, streams)
        tokens = [
            self._new(op, record, (), label, self._index_of(label), context) for label in labels
        ]
        if tokens:
            self._barrier(op, context, streams, tokens)
        device_type = str(op.args[0]) if op.args else "cpu"
        if device_type != "cpu":
            self._new(op, native_device_synchronize, (), None, self.main_index, context)

    # -- synchronize: every stream that runs something later waits ---------------------------------

    def _index_of(self, label: str | None) -> int | None:
        if label is None:
            return self.main_index
        return self.table.torch_stream_labels.get(label)

    def _executed_labels(self, nodes: Any, streams: Any) -> list[str | None]:
        labels: dict[str | None, None] = {}
        for node in nodes:
            if node.name in streams.stream_of:
                if node.target not in (scope_enter, scope_exit, wait, record):
                    labels[streams.stream_of[node.name]] = None
        return list(labels)

    def _labels_before(self, op: TorchStreamOp, streams: Any) -> list[str | None]:
        before = []
        for node in self.graph.nodes:
            if node is op.anchor:
                break
            before.append(node)
        return self._executed_labels(before, streams)

    def _barrier(
        self,
        op: TorchStreamOp,
        context: Context,
        streams: Any,
        tokens: list[torch.fx.Node],
        skip: tuple[str | None, ...] = (),
    ) -> None:
        after, seen = [], False
        for node in self.graph.nodes:
            if seen:
                after.append(node)
            seen = seen or node is op.anchor
        for label in self._executed_labels(after, streams):
            if label not in skip:
                self._new(op, wait, (list(tokens),), label, self._index_of(label), context)

    def _recorded_later(self, op: TorchStreamOp, event: int) -> bool:
        seen = False
        for node in self.graph.nodes:
            if node is op.anchor:
                seen = True
            elif seen and torch_internals.torch_stream_op(node.target) == "record_event":
                if node.args and node.args[0] == event:
                    return True
        return False


# What each op of torch's stream IR means (every name in torch_internals.STREAM_OPS)
HANDLERS: dict[str, Callable[[Lowerer, TorchStreamOp, Context, Any], None]] = {
    "record_event": Lowerer._record_event,
    "wait_event": Lowerer._wait_event,
    "wait_stream": Lowerer._wait_stream,
    "record_stream": Lowerer._record_stream,
    "sync_dealloc": Lowerer._sync_dealloc,
    "fork": Lowerer._fork,
    "join": Lowerer._fork,  # a switch back: the annotations place each node
    "synchronize_event": Lowerer._synchronize_event,
    "synchronize_stream": Lowerer._synchronize_stream,
    "synchronize_device": Lowerer._synchronize_device,
}
