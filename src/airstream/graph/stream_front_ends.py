"""Each node's stream in a graph still in the passes, worked out from the front ends that say it,
and the checks of its scopes: what :func:`airstream.graph.streams.lower_streams` writes into the
nodes' keys, and what :func:`airstream.graph.streams.settle_annotations` settles on the Dynamo
graph.

The rules: the main stream is label ``None``; a node between ``scope_enter`` (key
``_user_stream_label``) and its matching ``scope_exit`` runs on that label, scopes nest and the
innermost label wins; inside a scope a torch stream index is an inner block unless the scope was
opened inside that same block; outside every stream scope a torch stream index, else the
``air_stream`` annotation, decides (the backend removes, before AOTAutograd, a torch stream index
from every node that an inner ``airstream.stream`` block moved: ``settle_annotations``; no rule
reads the order of the annotation dict); else the node is on main. ``getitem`` (tuple indexing, no
kernel) runs on its producer's stream, wherever it sits. ``scope_enter``/``scope_exit`` sit on the
stream around the scope they open/close. Other scope keys are reported per node (``scope_attrs``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx

from airstream.errors import StreamError
from airstream.graph.nodes import describe
from airstream.graph.stream_assignment import (
    CALLS,
    StreamAssignment,
    assignment,
    call_target,
    check_wait,
    check_wait_tensor,
    kind_of,
)
from airstream.ops.library import (
    STREAM_LABEL_KEY,
    STREAM_PRIORITY_KEY,
    scope_enter,
    scope_exit,
    wait,
    wait_tensor,
)
from airstream.ops.stream import STREAM_ANNOTATION, STREAM_PRIORITY_ANNOTATION
from airstream.ops.torch_streams import TorchStreams, torch_stream_index, torch_streams_of
from airstream.torch_internals import stream_annotations

__all__ = ["Walk", "walk"]

_GRAPH_BREAK_HINT = (
    "A graph break inside a stream scope is the usual cause: the graph ends (or starts) inside "
    "the scope. Find the break with torch.compile(..., fullgraph=True) or "
    "torch._dynamo.explain, and remove it; a custom pass must insert scope_enter and scope_exit "
    "in pairs within one graph."
)


@dataclass
class _Scope:
    node: torch.fx.Node
    label: str | None
    attrs: dict[str, str]
    native: int | None = None  # the torch stream its scope_enter was traced under


def _torch_stream_label(node: torch.fx.Node, index: int, table: TorchStreams | None) -> str | None:
    """The label of the torch stream at registry ``index`` (``stream<i>`` without a table)."""
    if table is None:
        return f"stream{index}"
    try:
        return table.label(index)
    except KeyError as exc:
        raise StreamError(f"{describe(node)}: {exc.args[0]}") from None


def _parse_enter(node: torch.fx.Node) -> _Scope:
    keys = node.kwargs.get("keys", node.args[0] if node.args else None)
    values = node.kwargs.get("values", node.args[1] if len(node.args) > 1 else None)
    if not isinstance(keys, (list, tuple)) or not isinstance(values, (list, tuple)):
        raise StreamError(f"{describe(node)}: scope_enter needs two lists, keys and values")
    if len(keys) != len(values):
        raise StreamError(
            f"{describe(node)}: scope_enter has {len(keys)} keys but {len(values)} values; "
            "pass one value per key"
        )
    attrs = {str(k): str(v) for k, v in zip(keys, values, strict=True)}
    label = attrs.pop(STREAM_LABEL_KEY, None)
    if label is not None and not label:
        raise StreamError(f"{describe(node)}: the stream label ({STREAM_LABEL_KEY}) is empty")
    return _Scope(node, label, attrs)


def _parse_priority(node: torch.fx.Node, raw: object) -> int:
    try:
        return int(str(raw))
    except ValueError:
        raise StreamError(f"{describe(node)}: stream priority {raw!r} is not an integer") from None


def _annotation(
    node: torch.fx.Node, native: int | None, table: TorchStreams | None
) -> tuple[str | None, int | None]:
    """A node's stream outside every stream scope: its torch.Stream block's (``native``, its
    registry index), else its ``airstream.stream`` annotation's (with the priority the
    annotation gives)."""
    if native is not None:
        return _torch_stream_label(node, native, table), None
    custom = stream_annotations(node)
    label = custom.get(STREAM_ANNOTATION)
    if label is not None and (not isinstance(label, str) or not label):
        raise StreamError(
            f"{describe(node)}: node.meta['custom'][{STREAM_ANNOTATION!r}] must be a non-empty "
            f"str stream label, got {label!r}"
        )
    priority = custom.get(STREAM_PRIORITY_ANNOTATION)
    return label, None if priority is None else _parse_priority(node, priority)


class Walk:
    """What one walk over a graph (:func:`walk`) finds: every call's stream, the scopes around
    it, the checks. ``shadowed``: the nodes whose torch stream index an inner ``airstream.stream``
    scope overrides."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.kind = kind_of(gm)
        self.table = torch_streams_of(gm)
        self.stack: list[_Scope] = []
        self.stream_of: dict[str, str | None] = {}
        self.scope_attrs: dict[str, dict[str, str]] = {}
        self.given: dict[str, list[tuple[torch.fx.Node, int]]] = {}  # label: its priorities
        self.shadowed: list[torch.fx.Node] = []

    def _label(self, node: torch.fx.Node, native: int | None) -> str | None:
        """The front ends' answer for ``node`` (the scope stack as it stands at it)."""
        scope = next((s for s in reversed(self.stack) if s.label is not None), None)
        marker = call_target(node) in (scope_enter, scope_exit)  # on the stream around its scope
        if scope is not None:
            # a torch.Stream block entered inside the scope is inner; one entered around it is not
            if native is not None and native != scope.native:
                return _torch_stream_label(node, native, self.table)
            if native is not None and not marker:
                self.shadowed.append(node)
            return scope.label
        if not marker:  # outside every stream scope: the annotations decide
            label, priority = _annotation(node, native, self.table)
            if label is not None and priority is not None:
                self.given.setdefault(label, []).append((node, priority))
            return label
        if native is not None:  # a marker inside a torch.Stream block only
            return _torch_stream_label(node, native, self.table)
        return None

    def visit(self, node: torch.fx.Node) -> None:
        target = call_target(node)
        if target is scope_exit:
            if not self.stack:
                raise StreamError(
                    f"{describe(node)} in the {self.kind} graph closes a scope that was never "
                    "opened: you must first call the torch.ops.air.scope_enter operator, as "
                    f"scope_enter and scope_exit are called in pairs. {_GRAPH_BREAK_HINT}"
                )
            self.stack.pop()
        native = torch_stream_index(node)
        label = self._label(node, native)  # the front ends' (their priorities noted)
        producer = node.args[0] if target is operator.getitem and node.args else None
        if isinstance(producer, torch.fx.Node) and producer.name in self.stream_of:
            label = self.stream_of[producer.name]  # tuple indexing runs with its producer
        self.stream_of[node.name] = label
        attrs: dict[str, str] = {}
        for scope in self.stack:
            attrs.update(scope.attrs)
        if attrs:
            self.scope_attrs[node.name] = attrs
        if target is scope_enter:
            opened = _parse_enter(node)
            opened.native = native
            if opened.label is not None:
                raw = opened.attrs.pop(STREAM_PRIORITY_KEY, None)
                if raw is not None:
                    prio = _parse_priority(node, raw)
                    self.given.setdefault(opened.label, []).append((node, prio))
            self.stack.append(opened)
        elif target is wait:
            check_wait(node)
        elif target is wait_tensor:
            check_wait_tensor(node)

    def result(self) -> StreamAssignment:
        order: dict[str | None, None] = dict.fromkeys([None, *self.stream_of.values()])
        priorities: dict[str, int] = {}
        notes: list[str] = []
        for label, given in self.given.items():
            if label not in order:  # a stream nothing runs on (single-stream mode)
                continue
            (_, first), *rest = given
            priorities[label] = first
            for node, priority in rest:
                if priority != first:
                    notes.append(
                        f"airstream: stream {label!r} is given priority {priority} at "
                        f"{describe(node)} but priority {first} earlier in the {self.kind} "
                        f"graph; using {first}"
                    )
        return assignment(self.stream_of, self.scope_attrs, priorities, tuple(notes))


def walk(gm: torch.fx.GraphModule) -> Walk:
    """Walk ``gm``'s calls in order; raise StreamError for a scope left open."""
    found = Walk(gm)
    for node in gm.graph.nodes:
        if node.op in CALLS:
            found.visit(node)
    if found.stack:
        scope = found.stack[-1]
        what = f"stream scope {scope.label!r}" if scope.label else f"scope {scope.attrs}"
        raise StreamError(
            f"{describe(scope.node)} in the {found.kind} graph opens {what} that is never "
            "closed: there is no paired call to the torch.ops.air.scope_exit operator. "
            f"{_GRAPH_BREAK_HINT}"
        )
    return found
