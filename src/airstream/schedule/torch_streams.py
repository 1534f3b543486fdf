"""PyTorch's stream IR lowered to airstream's: ``torch.Stream`` blocks, ``torch.Event`` and
``wait_stream`` in a graph become streams, ``record`` and ``wait``.

What Dynamo writes (and passes may write), by torch release (``torch_internals.streams``):
``node.meta["custom"]`` stream indices, ``torch.ops.streams.*`` ops bare or wrapped in
``control_deps``, and torch 2.11's method calls on stream objects. :func:`lower_torch_streams`
rewrites a graph in place:

- Dynamo's stream annotation moves to airstream's key (``ops/torch_streams.py``): stream analysis
  reads it through the graph's :class:`~airstream.ops.torch_streams.TorchStreams` table, so each
  stream object is one airstream stream (its variable's name), and AOTAutograd, which would act on
  Dynamo's key, never sees it.
- Each op gets its CUDA meaning in airstream's terms, at its place in program order:
  ``record_event(e, s)`` is an ``air.record()`` on ``s`` (the event's token); ``wait_event(e, s)``
  an ``air.wait`` on ``s`` for the event's last record before it; ``wait_stream(a, b)`` a record
  on ``b`` and a wait on ``a``; a synchronize is a record on what it waits for and a wait on every
  stream that runs something after it (the host waits, so all later work does); ``sync_dealloc``
  a wait that also holds the tensor until then; ``fork``/``join`` only switch the current
  stream, which the annotations already say.
- What only the user's own objects can do stays as a ``native_*`` step (CUDA objects only):
  recording the user's event, waiting for one recorded outside the graph, the host synchronizes,
  ``record_stream``. For CPU objects there is nothing left to do: the host ran all work before the
  call, and a CPU tensor lives as long as something reads it.

Anything it cannot honour is one warning naming the source line. Each op's handler is in
:mod:`airstream.schedule.torch_stream_ops`.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

from airstream import torch_internals
from airstream.graph.nodes import GRAPH_KIND_KEY
from airstream.graph.streams import settle_annotations
from airstream.ops.torch_streams import (
    TORCH_STREAM_ANNOTATION,
    TorchStreams,
    attach_torch_streams,
    torch_stream_index,
)
from airstream.schedule.torch_stream_forms import (
    collect_torch_stream_ops,
    drop_dead_objects,
)
from airstream.schedule.torch_stream_ops import Lowerer, TorchStreamLowering, contexts

__all__ = ["TorchStreamLowering", "uses_torch_streams", "lower_torch_streams", "torch_streams_for"]

log = logging.getLogger(__name__)


def uses_torch_streams(gm: torch.fx.GraphModule) -> bool:
    """Does ``gm`` use PyTorch's stream IR (cheap: no registry access for plain graphs)?"""
    return any(
        torch_stream_index(node) is not None or torch_internals.mentions_torch_stream_ir(node)
        for node in gm.graph.nodes
    )


def torch_streams_for(
    gm: torch.fx.GraphModule, table: TorchStreams | None = None
) -> TorchStreams | None:
    """The streams and events table of ``gm``, attached to it: ``table`` (its Dynamo graph's,
    which its forward and backward graphs share), else, where ``gm`` uses PyTorch's stream IR,
    one made from Dynamo's registry now; None for a graph with neither."""
    if table is None and uses_torch_streams(gm):
        table = TorchStreams.from_registry()
    if table is not None:
        attach_torch_streams(gm, table)
    return table


def _move_annotations(gm: torch.fx.GraphModule) -> int:
    moved = 0
    for node in gm.graph.nodes:
        moved += torch_internals.rename_dynamo_stream_annotation(node, TORCH_STREAM_ANNOTATION)
    return moved


def lower_torch_streams(gm: torch.fx.GraphModule, table: TorchStreams) -> TorchStreamLowering:
    """Rewrite ``gm``'s torch stream IR into airstream's, in place (see the module docstring);
    attach ``table`` to ``gm`` for stream analysis, and leave each node one stream annotation
    (:func:`airstream.graph.streams.settle_annotations`). Raises StreamError for an op whose
    arguments are not what it needs (an event where a stream is needed), naming its source line."""
    torch_internals.require("torch-streams")
    attach_torch_streams(gm, table)
    kind = str(gm.meta.get(GRAPH_KIND_KEY, "given"))
    lowering = Lowerer(gm, table, kind)
    lowering.report.annotated = _move_annotations(gm)
    ops = collect_torch_stream_ops(gm, table)
    if ops:
        lowering.lower(ops, contexts(gm))
    drop_dead_objects(gm)
    settle_annotations(gm)
    gm.graph.lint()
    if lowering.report.changed:
        log.debug("torch streams (%s graph): %s", kind, lowering.report)
    return lowering.report
