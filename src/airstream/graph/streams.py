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
Before that, for a graph still in the passes, it works the answer out from the front ends, by
their rules (:mod:`airstream.graph.stream_front_ends`). Both answer with a
:class:`StreamAssignment` (:mod:`airstream.graph.stream_assignment`).

Both readers are pure: they read the graph and return plain data (warnings travel as
``notes``, emitted by whoever plans the graph). Reading the keys is one walk over the graph, so
nothing is kept between calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch.fx

from airstream.errors import StreamError
from airstream.graph.effects import effects
from airstream.graph.foreign_ops import caller_threads_why
from airstream.graph.nodes import describe
from airstream.graph.stream_assignment import (
    CALLS,
    SCOPE_KEY,
    STREAM_KEY,
    StreamAssignment,
    assignment,
    call_target,
    check_wait,
    check_wait_tensor,
    kind_of,
)
from airstream.graph.stream_front_ends import walk
from airstream.ops.library import wait, wait_tensor
from airstream.ops.torch_streams import drop_torch_stream_index

__all__ = [
    "SCOPE_KEY",
    "STREAM_KEY",
    "StreamAssignment",
    "assign_streams",
    "is_lowered",
    "lower_streams",
    "settle_annotations",
]

_LOWERED_KEY = "air_streams_lowered"  # gm.meta: every call carries STREAM_KEY (_Lowered)


@dataclass(frozen=True)
class _Lowered:
    """What a lowered graph keeps about its streams beside each node's key: the priorities its
    scopes and annotations gave, and what the lowering warned about."""

    priorities: Mapping[str, int]
    notes: tuple[str, ...]


def _read(gm: torch.fx.GraphModule, lowered: _Lowered) -> StreamAssignment:
    """A lowered graph's streams, read from its nodes' keys, and its waits checked."""
    stream_of: dict[str, str | None] = {}
    scope_attrs: dict[str, Mapping[str, str]] = {}
    for node in gm.graph.nodes:
        if node.op not in CALLS:
            continue
        meta = node.meta
        if STREAM_KEY not in meta:
            raise StreamError(
                f"{describe(node)} in the {kind_of(gm)} graph has no stream: a stage after the "
                "passes added it without node.meta[airstream.graph.streams.STREAM_KEY] (copy the "
                "meta of the node it replaces). This is a bug in airstream."
            )
        stream_of[node.name] = meta[STREAM_KEY]
        if meta[STREAM_KEY] is not None and effects(node).caller_threads:
            raise StreamError(
                f"{describe(node)} in the {kind_of(gm)} graph is on stream {meta[STREAM_KEY]!r}, "
                "but it must run on the main stream with the caller's intra-op threads ("
                f"{caller_threads_why((node.target, *node.args)) or 'declared'}; "
                "airstream.graph.foreign_ops). Leave it out of the nodes your pass places on a "
                "side stream."
            )
        attrs = meta.get(SCOPE_KEY)
        if attrs:
            scope_attrs[node.name] = attrs
        target = call_target(node)
        if target is wait:
            check_wait(node)
        elif target is wait_tensor:
            check_wait_tensor(node)
    return assignment(stream_of, scope_attrs, lowered.priorities, lowered.notes)


def assign_streams(gm: torch.fx.GraphModule) -> StreamAssignment:
    """Every node's stream, and the stream program checked; raises StreamError if invalid.
    A lowered graph's (:func:`lower_streams`) is read from its nodes' keys; a graph still in
    the passes has it worked out from its front ends. Reads the graph only."""
    lowered = gm.meta.get(_LOWERED_KEY)
    if isinstance(lowered, _Lowered):
        return _read(gm, lowered)
    return walk(gm).result()


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
    found = walk(gm)
    labels = found.stream_of
    for node in gm.graph.nodes:
        if node.op not in CALLS:
            continue
        if single_stream:
            labels[node.name] = None
        node.meta[STREAM_KEY] = labels[node.name]
        attrs = found.scope_attrs.get(node.name)
        if attrs is not None:
            node.meta[SCOPE_KEY] = dict(attrs)
    result = found.result()
    gm.meta[_LOWERED_KEY] = _Lowered(dict(result.priorities), result.notes)
    return result  # what reading the keys now gives


def uses_streams(gm: torch.fx.GraphModule) -> bool:
    """Whether a lowered graph runs any call off the main stream."""
    return any(node.meta.get(STREAM_KEY) is not None for node in gm.graph.nodes)


def settle_annotations(gm: torch.fx.GraphModule) -> int:
    """Remove the torch stream index of every node an inner ``airstream.stream`` block moved
    off that stream; return how many. Run on the Dynamo graph before AOTAutograd: scope markers
    say which block is inner there, and a backward graph, which has no markers, then reads each
    node's one remaining annotation (its torch stream index where the torch.Stream block is inner,
    else its ``air_stream`` label)."""
    shadowed = walk(gm).shadowed
    for node in shadowed:
        drop_torch_stream_index(node)
    return len(shadowed)
