"""Stream analysis: which stream each node runs on, and the checks that reject bad graphs.

Rules (docs/design.md section 3): the main stream is label ``None``; a node between ``scope_enter``
(key ``_user_stream_label``) and its matching ``scope_exit`` runs on that label, scopes nest and
the innermost label wins; a node outside every stream scope may carry
``node.meta["custom"]["air_stream"]`` or a ``torch.Stream`` block's registry index (read through
the graph's ``NativeStreams`` table; the later of the two annotations is the inner block), and
inside a scope a native index is inner unless the scope was opened inside that block; else it is
on the main stream. ``getitem`` (tuple indexing,
no kernel) runs on its producer's stream, wherever it sits. ``scope_enter``/``scope_exit`` sit on
the stream around the scope they open/close, in every model (an annotation never moves them).
Other scope keys are reported per node (``scope_attrs``). With ``ge_config.enable_single_stream``
every node is on main.

The analysis is pure: it reads the graph and returns plain data (warnings about it travel as
``notes``, emitted by whoever plans the graph). :func:`stream_analysis` keeps the result of the
graph's current version: the pipeline marks each version (:func:`mark_version`) once a stage has
finished editing the graph, and takes the mark away (:func:`unmark_version`) before a pass runs;
a graph without a mark is analysed afresh every time.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
import torch.fx

from airstream.errors import StreamError
from airstream.nodes import describe
from airstream.ops.library import (
    STREAM_LABEL_KEY,
    STREAM_PRIORITY_KEY,
    record,
    scope_enter,
    scope_exit,
    wait,
    wait_tensor,
)
from airstream.ops.native import (
    NativeStreams,
    innermost_annotation,
    native_index,
    native_streams_of,
)
from airstream.ops.stream import STREAM_ANNOTATION, STREAM_PRIORITY_ANNOTATION
from airstream.torch_internals import node_value, stream_annotations

__all__ = [
    "StreamAssignment",
    "assign_streams",
    "mark_version",
    "stream_analysis",
    "unmark_version",
]

_VERSION_KEY = "air_graph_version"  # gm.meta: a token for the graph as it stands
_ANALYSIS_KEY = "air_stream_analysis"  # gm.meta: (token, single_stream, its StreamAssignment)

_GRAPH_BREAK_HINT = (
    "A graph break inside a stream scope is the usual cause: the graph ends (or starts) inside "
    "the scope. Find the break with torch.compile(..., fullgraph=True) or "
    "torch._dynamo.explain, and remove it; a custom pass must insert scope_enter and scope_exit "
    "in pairs within one graph."
)


@dataclass(frozen=True)
class StreamAssignment:
    """The result of stream analysis: plain data, keyed by node name.

    Attributes:
        stream_of: every call's stream label (``None`` = main stream): each ``call_function``
            node (and, in a Dynamo graph, each ``call_method`` and ``call_module`` node).
            ``scope_enter`` and ``scope_exit`` are on the stream around the scope they open or
            close (main at the top level; never an annotation's), not on the stream they
            delimit: ``nodes_on(label)`` is what runs on it. ``record`` and ``wait`` are on
            the stream of their position (the stream that records or waits).
        streams: the labels in order of first use, main stream (``None``) first.
        priorities: priority per side-stream label (from the scope or the annotation).
        scope_attrs: per node, the non-stream scope keys in force (e.g. TorchAir's
            ``_super_kernel_scope``), for nodes that have any.
        notes: what the analysis warns about (a stream given two priorities), for the stage
            that plans the graph to emit.
    """

    stream_of: Mapping[str, str | None]
    streams: tuple[str | None, ...]
    priorities: Mapping[str, int] = field(default_factory=dict)
    scope_attrs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def stream(self, node: torch.fx.Node | str) -> str | None:
        """The stream label of ``node`` (a node or its name)."""
        name = node if isinstance(node, str) else node.name
        return self.stream_of[name]

    def nodes_on(self, label: str | None) -> list[str]:
        """Names of the nodes on stream ``label``, in graph order."""
        return [name for name, s in self.stream_of.items() if s == label]

    @property
    def side_streams(self) -> tuple[str, ...]:
        """The labels of all streams other than main."""
        return tuple(s for s in self.streams if s is not None)


@dataclass
class _Scope:
    node: torch.fx.Node
    label: str | None
    attrs: dict[str, str]
    native: int | None = None  # the native stream its scope_enter was traced under


def _native_label(node: torch.fx.Node, index: int, table: NativeStreams | None) -> str | None:
    """The label of the native stream at registry ``index`` (``stream<i>`` without a table)."""
    if table is None:
        return f"stream{index}"
    try:
        return table.label(index)
    except KeyError as exc:
        raise StreamError(f"{describe(node)}: {exc.args[0]}") from None


# the nodes that run: an aten graph's calls, and a Dynamo graph's method and module calls
_CALLS = frozenset({"call_function", "call_method", "call_module"})


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


def _is_tensor_node(arg: object) -> bool:
    return isinstance(arg, torch.fx.Node) and isinstance(node_value(arg), torch.Tensor)


def _check_wait(node: torch.fx.Node) -> None:
    deps = node.kwargs.get("x", node.args[0] if node.args else None)
    if not isinstance(deps, (list, tuple)) or not deps:
        raise StreamError(
            f"{describe(node)}: wait needs a non-empty list of record tokens or tensors, "
            f"got {deps!r}"
        )
    for i, dep in enumerate(deps):
        if isinstance(dep, torch.fx.Node) and dep.target is record:
            continue
        if _is_tensor_node(dep):
            continue
        what = describe(dep) if isinstance(dep, torch.fx.Node) else repr(dep)
        raise StreamError(
            f"{describe(node)}: element {i} of wait's list is {what}, which is neither a "
            "record token nor a tensor. Pass the node returned by air.record, or a node that "
            "produces a tensor."
        )


def _check_wait_tensor(node: torch.fx.Node) -> None:
    for i, name in enumerate(("self", "dependency")):
        arg = node.kwargs.get(name, node.args[i] if len(node.args) > i else None)
        if not _is_tensor_node(arg):
            what = describe(arg) if isinstance(arg, torch.fx.Node) else repr(arg)
            raise StreamError(
                f"{describe(node)}: wait_tensor's {name!r} argument must be a node producing a "
                f"tensor, got {what}"
            )


def _annotation(node: torch.fx.Node, table: NativeStreams | None) -> tuple[str | None, int | None]:
    custom = stream_annotations(node)
    innermost = innermost_annotation(node)
    if innermost is not None and innermost[0] == "native":
        return _native_label(node, innermost[1], table), None
    label = custom.get(STREAM_ANNOTATION)
    if label is not None and (not isinstance(label, str) or not label):
        raise StreamError(
            f"{describe(node)}: node.meta['custom'][{STREAM_ANNOTATION!r}] must be a non-empty "
            f"str stream label, got {label!r}"
        )
    priority = custom.get(STREAM_PRIORITY_ANNOTATION)
    return label, None if priority is None else _parse_priority(node, priority)


def assign_streams(
    gm: torch.fx.GraphModule, *, single_stream: bool = False, graph_kind: str = "graph"
) -> StreamAssignment:
    """Decide every node's stream and check the stream program; raise StreamError if invalid.
    Reads the graph only."""
    stack: list[_Scope] = []
    notes: list[str] = []
    table = native_streams_of(gm)
    stream_of: dict[str, str | None] = {}
    priorities: dict[str, int] = {}
    scope_attrs: dict[str, dict[str, str]] = {}
    order: dict[str | None, None] = {None: None}

    def note_priority(node: torch.fx.Node, label: str, priority: int | None) -> None:
        if priority is None:
            return
        old = priorities.setdefault(label, priority)
        if old != priority:
            notes.append(
                f"airstream: stream {label!r} is given priority {priority} at {describe(node)} "
                f"but priority {old} earlier in the {graph_kind} graph; using {old}"
            )

    for node in gm.graph.nodes:
        if node.op not in _CALLS:
            continue
        if node.target is scope_exit:
            if not stack:
                raise StreamError(
                    f"{describe(node)} in the {graph_kind} graph closes a scope that was never "
                    "opened: you must first call the torch.ops.air.scope_enter operator, as "
                    f"scope_enter and scope_exit are called in pairs. {_GRAPH_BREAK_HINT}"
                )
            stack.pop()
        scope = next((s for s in reversed(stack) if s.label is not None), None)
        label = scope.label if scope is not None else None
        marker = node.target in (scope_enter, scope_exit)  # on the stream around its scope
        native = native_index(node)
        if scope is not None:
            # a native block entered inside the scope is inner; one entered around it is not
            if native is not None and native != scope.native:
                label = _native_label(node, native, table)
        elif not marker:  # outside every stream scope: the innermost annotation decides
            label, priority = _annotation(node, table)
            if label is not None and not single_stream:
                note_priority(node, label, priority)
        elif native is not None:  # a marker inside a native block only
            label = _native_label(node, native, table)
        producer = node.args[0] if node.target is operator.getitem and node.args else None
        if isinstance(producer, torch.fx.Node) and producer.name in stream_of:
            label = stream_of[producer.name]  # tuple indexing runs with its producer
        attrs: dict[str, str] = {}
        for scope in stack:
            attrs.update(scope.attrs)
        if single_stream:
            label = None
        stream_of[node.name] = label
        order.setdefault(label, None)
        if attrs:
            scope_attrs[node.name] = attrs
        if node.target is scope_enter:
            opened = _parse_enter(node)
            opened.native = native
            if opened.label is not None:
                raw = opened.attrs.pop(STREAM_PRIORITY_KEY, None)
                prio = None if raw is None else _parse_priority(node, raw)
                if not single_stream:
                    note_priority(node, opened.label, prio)
            stack.append(opened)
        elif node.target is wait:
            _check_wait(node)
        elif node.target is wait_tensor:
            _check_wait_tensor(node)

    if stack:
        scope = stack[-1]
        what = f"stream scope {scope.label!r}" if scope.label else f"scope {scope.attrs}"
        raise StreamError(
            f"{describe(scope.node)} in the {graph_kind} graph opens {what} that is never closed: "
            "there is no paired call to the torch.ops.air.scope_exit operator. "
            f"{_GRAPH_BREAK_HINT}"
        )
    return StreamAssignment(
        stream_of=MappingProxyType(stream_of),
        streams=tuple(order),
        priorities=MappingProxyType(priorities),
        scope_attrs=MappingProxyType({k: MappingProxyType(v) for k, v in scope_attrs.items()}),
        notes=tuple(notes),
    )


def mark_version(gm: torch.fx.GraphModule) -> None:
    """The graph will not change until :func:`unmark_version`: analyses of it may be kept."""
    gm.meta[_VERSION_KEY] = object()


def unmark_version(gm: torch.fx.GraphModule) -> None:
    """The graph is about to change (a pass runs): forget what was kept about it."""
    gm.meta.pop(_VERSION_KEY, None)
    gm.meta.pop(_ANALYSIS_KEY, None)


def stream_analysis(
    gm: torch.fx.GraphModule, *, single_stream: bool = False, graph_kind: str = "graph"
) -> StreamAssignment:
    """:func:`assign_streams`, computed once per marked version of the graph."""
    token = gm.meta.get(_VERSION_KEY)
    if token is None:
        return assign_streams(gm, single_stream=single_stream, graph_kind=graph_kind)
    kept = gm.meta.get(_ANALYSIS_KEY)
    if kept is not None and kept[0] is token and kept[1] == single_stream:
        return kept[2]
    found = assign_streams(gm, single_stream=single_stream, graph_kind=graph_kind)
    gm.meta[_ANALYSIS_KEY] = (token, single_stream, found)
    return found
