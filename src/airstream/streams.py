"""Each node's stream: the one fact every stage after the passes reads, and the checks that
reject bad stream programs.

Model code and passes say where a node runs in several ways (the front ends): ``scope_enter``/
``scope_exit`` markers (a pass's, TorchAir's, ``airstream.stream``'s), the ``air_stream``
annotation (``airstream.stream``; it reaches backward graphs), a ``torch.Stream`` block's registry
index (read through the graph's ``TorchStreams`` table), TorchAir's tagged events and PyTorch's
event ops (lowered to ``record``/``wait`` before this is asked) and ``ge_config.
enable_single_stream``. At the end of the passes :func:`lower_streams` writes the answer into
one key per node, ``node.meta["air_stream_label"]`` (:data:`STREAM_KEY`), with the non-stream
scope keys in ``node.meta["air_scope"]``; from then on :func:`assign_streams` reads those keys
and checks the graph (a node a later stage added without a stream is an error naming it).
Before that, for a graph still in the passes, it works the answer out from the front ends:

the main stream is label ``None``; a node between ``scope_enter`` (key ``_user_stream_label``)
and its matching ``scope_exit`` runs on that label, scopes nest and the innermost label wins;
inside a scope a torch stream index is an inner block unless the scope was opened inside that same
block; outside every stream scope a torch stream index, else the ``air_stream`` annotation, decides
(the backend removes, before AOTAutograd, a torch stream index from every node that an inner
``airstream.stream`` block moved: :func:`settle_annotations`; no rule reads the order of the
annotation dict); else the node is on main. ``getitem`` (tuple indexing, no kernel) runs on its
producer's stream, wherever it sits. ``scope_enter``/``scope_exit`` sit on the stream around the
scope they open/close. Other scope keys are reported per node (``scope_attrs``).

Both readers are pure: they read the graph and return plain data (warnings travel as
``notes``, emitted by whoever plans the graph). Reading the keys is one walk over the graph, so
nothing is kept between calls.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
import torch.fx

from airstream.effects import effects
from airstream.errors import StreamError
from airstream.foreign_ops import caller_threads_why
from airstream.nodes import GRAPH_KIND_KEY, describe
from airstream.ops.library import (
    STREAM_LABEL_KEY,
    STREAM_PRIORITY_KEY,
    air_op_for,
    record,
    scope_enter,
    scope_exit,
    wait,
    wait_tensor,
)
from airstream.ops.stream import STREAM_ANNOTATION, STREAM_PRIORITY_ANNOTATION
from airstream.ops.torch_streams import (
    TorchStreams,
    drop_torch_stream_index,
    torch_stream_index,
    torch_streams_of,
)
from airstream.torch_internals import node_value, stream_annotations

__all__ = [
    "SCOPE_KEY",
    "STREAM_KEY",
    "StreamAssignment",
    "assign_streams",
    "is_lowered",
    "lower_streams",
    "settle_annotations",
]

STREAM_KEY = "air_stream_label"  # node.meta: the node's stream (None: main), once lowered
SCOPE_KEY = "air_scope"  # node.meta: the non-stream scope keys in force (TorchAir's scopes)
_LOWERED_KEY = "air_streams_lowered"  # gm.meta: every call node carries STREAM_KEY (_Lowered)

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
    native: int | None = None  # the torch stream its scope_enter was traced under


@dataclass(frozen=True)
class _Lowered:
    """What a lowered graph keeps about its streams beside each node's key: the priorities its
    scopes and annotations gave, and what the lowering warned about."""

    priorities: Mapping[str, int]
    notes: tuple[str, ...]


# the nodes that run: an aten graph's calls, and a Dynamo graph's method and module calls
_CALLS = frozenset({"call_function", "call_method", "call_module"})


@functools.lru_cache(maxsize=4096)
def _op(target: object) -> object:
    return air_op_for(target) or target


def _target(node: torch.fx.Node) -> object:
    """The node's op, an ``air`` op written as its packet (a Dynamo graph's) or another name of
    it (TorchAir's ``npugraph_ex``) read as the op itself."""
    target = node.target
    try:
        return _op(target)
    except TypeError:  # not hashable (a call_module's string is; a bound method may not be)
        return air_op_for(target) or target


def _kind(gm: torch.fx.GraphModule) -> str:
    """The graph's kind for messages: ``inference``, ``forward``, ``backward``, ``Dynamo``."""
    return str(gm.meta.get(GRAPH_KIND_KEY, "given"))


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
        if isinstance(dep, torch.fx.Node) and _target(dep) is record:
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


class _Walk:
    """What one walk over a graph (:func:`_walk`) finds: every call's stream, the scopes around
    it, the checks. ``shadowed``: the nodes whose torch stream index an inner ``airstream.stream``
    scope overrides."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.kind = _kind(gm)
        self.table = torch_streams_of(gm)
        self.stack: list[_Scope] = []
        self.stream_of: dict[str, str | None] = {}
        self.scope_attrs: dict[str, dict[str, str]] = {}
        self.given: dict[str, list[tuple[torch.fx.Node, int]]] = {}  # label: its priorities
        self.shadowed: list[torch.fx.Node] = []

    def _label(self, node: torch.fx.Node, native: int | None) -> str | None:
        """The front ends' answer for ``node`` (the scope stack as it stands at it)."""
        scope = next((s for s in reversed(self.stack) if s.label is not None), None)
        marker = _target(node) in (scope_enter, scope_exit)  # on the stream around its scope
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
        target = _target(node)
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
            _check_wait(node)
        elif target is wait_tensor:
            _check_wait_tensor(node)

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
        return _assignment(self.stream_of, self.scope_attrs, priorities, tuple(notes))


def _assignment(
    stream_of: dict[str, str | None],
    scope_attrs: Mapping[str, Mapping[str, str]],
    priorities: Mapping[str, int],
    notes: tuple[str, ...],
) -> StreamAssignment:
    order = dict.fromkeys([None, *stream_of.values()])
    return StreamAssignment(
        stream_of=MappingProxyType(stream_of),
        streams=tuple(order),
        priorities=MappingProxyType({k: v for k, v in priorities.items() if k in order}),
        scope_attrs=MappingProxyType({k: MappingProxyType(v) for k, v in scope_attrs.items()}),
        notes=notes,
    )


def _read(gm: torch.fx.GraphModule, lowered: _Lowered) -> StreamAssignment:
    """A lowered graph's streams, read from its nodes' keys, and its waits checked."""
    stream_of: dict[str, str | None] = {}
    scope_attrs: dict[str, Mapping[str, str]] = {}
    for node in gm.graph.nodes:
        if node.op not in _CALLS:
            continue
        meta = node.meta
        if STREAM_KEY not in meta:
            raise StreamError(
                f"{describe(node)} in the {_kind(gm)} graph has no stream: a stage after the "
                "passes added it without node.meta[airstream.streams.STREAM_KEY] (copy the "
                "meta of the node it replaces). This is a bug in airstream."
            )
        stream_of[node.name] = meta[STREAM_KEY]
        if meta[STREAM_KEY] is not None and effects(node).caller_threads:
            raise StreamError(
                f"{describe(node)} in the {_kind(gm)} graph is on stream {meta[STREAM_KEY]!r}, "
                "but it must run on the main stream with the caller's intra-op threads ("
                f"{caller_threads_why((node.target, *node.args)) or 'declared'}; "
                "airstream.foreign_ops). Leave it out of the nodes your pass places on a side "
                "stream."
            )
        attrs = meta.get(SCOPE_KEY)
        if attrs:
            scope_attrs[node.name] = attrs
        target = _target(node)
        if target is wait:
            _check_wait(node)
        elif target is wait_tensor:
            _check_wait_tensor(node)
    return _assignment(stream_of, scope_attrs, lowered.priorities, lowered.notes)


def _walk(gm: torch.fx.GraphModule) -> _Walk:
    """Walk ``gm``'s calls in order; raise StreamError for a scope left open."""
    walk = _Walk(gm)
    for node in gm.graph.nodes:
        if node.op in _CALLS:
            walk.visit(node)
    if walk.stack:
        scope = walk.stack[-1]
        what = f"stream scope {scope.label!r}" if scope.label else f"scope {scope.attrs}"
        raise StreamError(
            f"{describe(scope.node)} in the {walk.kind} graph opens {what} that is never "
            "closed: there is no paired call to the torch.ops.air.scope_exit operator. "
            f"{_GRAPH_BREAK_HINT}"
        )
    return walk


def assign_streams(gm: torch.fx.GraphModule) -> StreamAssignment:
    """Every node's stream, and the stream program checked; raises StreamError if invalid.
    A lowered graph's (:func:`lower_streams`) is read from its nodes' keys; a graph still in
    the passes has it worked out from its front ends. Reads the graph only."""
    lowered = gm.meta.get(_LOWERED_KEY)
    if isinstance(lowered, _Lowered):
        return _read(gm, lowered)
    return _walk(gm).result()


def is_lowered(gm: torch.fx.GraphModule) -> bool:
    """Whether :func:`lower_streams` has written every node's stream into ``gm``."""
    return isinstance(gm.meta.get(_LOWERED_KEY), _Lowered)


def lower_streams(gm: torch.fx.GraphModule, *, single_stream: bool = False) -> StreamAssignment:
    """Write each call's stream into ``node.meta[STREAM_KEY]`` (every node on main with
    ``single_stream``) and its non-stream scope keys into ``node.meta[SCOPE_KEY]``, as the front
    ends say them now; return the analysis. The end of the passes: stages after it keep the key
    on every node they add (a node copied with its meta keeps it)."""
    if is_lowered(gm):
        return assign_streams(gm)
    walk = _walk(gm)
    labels = walk.stream_of
    for node in gm.graph.nodes:
        if node.op not in _CALLS:
            continue
        if single_stream:
            labels[node.name] = None
        node.meta[STREAM_KEY] = labels[node.name]
        attrs = walk.scope_attrs.get(node.name)
        if attrs is not None:
            node.meta[SCOPE_KEY] = dict(attrs)
    found = walk.result()
    gm.meta[_LOWERED_KEY] = _Lowered(dict(found.priorities), found.notes)
    return found  # what reading the keys now gives


def uses_streams(gm: torch.fx.GraphModule) -> bool:
    """Whether a lowered graph runs any call off the main stream."""
    return any(node.meta.get(STREAM_KEY) is not None for node in gm.graph.nodes)


def settle_annotations(gm: torch.fx.GraphModule) -> int:
    """Remove the torch stream index of every node an inner ``airstream.stream`` block moved
    off that stream; return how many. Run on the Dynamo graph before AOTAutograd: scope markers
    say which block is inner there, and a backward graph, which has no markers, then reads each
    node's one remaining annotation (its torch stream index where the torch.Stream block is inner,
    else its ``air_stream`` label)."""
    shadowed = _walk(gm).shadowed
    for node in shadowed:
        drop_torch_stream_index(node)
    return len(shadowed)
