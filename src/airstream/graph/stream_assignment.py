"""What stream analysis answers (:class:`StreamAssignment`), and what both of its readers share
(:mod:`airstream.graph.streams`, the lowered keys; :mod:`airstream.graph.stream_front_ends`, a
graph still in the passes): the calls that run on a stream, each call's op as the readers see it,
and the checks of ``wait`` and ``wait_tensor``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch
import torch.fx

from airstream.errors import StreamError
from airstream.graph.nodes import GRAPH_KIND_KEY, describe
from airstream.ops.library import air_op_for, record
from airstream.torch_internals import node_value

__all__ = [
    "CALLS",
    "SCOPE_KEY",
    "STREAM_KEY",
    "StreamAssignment",
    "assignment",
    "call_target",
    "check_wait",
    "check_wait_tensor",
    "kind_of",
]

STREAM_KEY = "air_stream_label"  # node.meta: the node's stream (None: main), once lowered
SCOPE_KEY = "air_scope"  # node.meta: the non-stream scope keys in force (TorchAir's scopes)


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


# the nodes that run: an aten graph's calls, and a Dynamo graph's method and module calls
CALLS = frozenset({"call_function", "call_method", "call_module"})


@functools.lru_cache(maxsize=4096)
def _op(target: object) -> object:
    return air_op_for(target) or target


def call_target(node: torch.fx.Node) -> object:
    """The node's op, an ``air`` op written as its packet (a Dynamo graph's) or another name of
    it (TorchAir's ``npugraph_ex``) read as the op itself."""
    target = node.target
    try:
        return _op(target)
    except TypeError:  # not hashable (a call_module's string is; a bound method may not be)
        return air_op_for(target) or target


def kind_of(gm: torch.fx.GraphModule) -> str:
    """The graph's kind for messages: ``inference``, ``forward``, ``backward``, ``Dynamo``."""
    return str(gm.meta.get(GRAPH_KIND_KEY, "given"))


def _is_tensor_node(arg: object) -> bool:
    return isinstance(arg, torch.fx.Node) and isinstance(node_value(arg), torch.Tensor)


def check_wait(node: torch.fx.Node) -> None:
    deps = node.kwargs.get("x", node.args[0] if node.args else None)
    if not isinstance(deps, (list, tuple)) or not deps:
        raise StreamError(
            f"{describe(node)}: wait needs a non-empty list of record tokens or tensors, "
            f"got {deps!r}"
        )
    for i, dep in enumerate(deps):
        if isinstance(dep, torch.fx.Node) and call_target(dep) is record:
            continue
        if _is_tensor_node(dep):
            continue
        what = describe(dep) if isinstance(dep, torch.fx.Node) else repr(dep)
        raise StreamError(
            f"{describe(node)}: element {i} of wait's list is {what}, which is neither a "
            "record token nor a tensor. Pass the node returned by air.record, or a node that "
            "produces a tensor."
        )


def check_wait_tensor(node: torch.fx.Node) -> None:
    for i, name in enumerate(("self", "dependency")):
        arg = node.kwargs.get(name, node.args[i] if len(node.args) > i else None)
        if not _is_tensor_node(arg):
            what = describe(arg) if isinstance(arg, torch.fx.Node) else repr(arg)
            raise StreamError(
                f"{describe(node)}: wait_tensor's {name!r} argument must be a node producing a "
                f"tensor, got {what}"
            )


def assignment(
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
