"""Tagged events in a compiled graph become airstream's own record/wait edges.

A ``tagged_event_wait(tag)`` whose ``tagged_event_record(tag)`` comes earlier in the same graph
(program order) is an ordering between two streams of this graph: the record becomes an
``air.record()`` token at the same place (so on the same stream) and each such wait an
``air.wait([token])``, which the planner turns into an event. The record itself stays (a
wait in eager code or a later graph may still need the event), as does a wait with no record
before it in the graph: both run their kernels as steps on their streams.
``record_tagged_stream`` is dropped from graphs: the CUDA runtime already calls
``record_stream`` for every tensor used on a stream that did not make it.
"""

from __future__ import annotations

import logging

import torch.fx

from airstream.ops.library import record, wait
from airstream.ops.tagged import record_tagged_stream, tagged_event_record, tagged_event_wait

__all__ = ["lower_tagged_events"]

log = logging.getLogger(__name__)


def _tag(node: torch.fx.Node) -> str:
    return str(node.args[0] if node.args else node.kwargs["tag"])


def lower_tagged_events(gm: torch.fx.GraphModule) -> int:
    """Rewrite paired tagged events in ``gm`` in place; return how many waits were paired."""
    graph = gm.graph
    last_record: dict[str, torch.fx.Node] = {}
    tokens: dict[torch.fx.Node, torch.fx.Node] = {}
    paired = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is tagged_event_record:
            last_record[_tag(node)] = node
        elif node.target is tagged_event_wait and _tag(node) in last_record:
            source = last_record[_tag(node)]
            if source not in tokens:
                with graph.inserting_before(source):
                    token = graph.call_function(record, ())
                token.meta.update(source.meta)
                token.meta["air_tagged_event"] = _tag(node)
                tokens[source] = token
            with graph.inserting_before(node):
                waiter = graph.call_function(wait, ([tokens[source]],))
            waiter.meta.update(node.meta)
            graph.erase_node(node)
            paired += 1
        elif node.target is record_tagged_stream:
            graph.erase_node(node)
    if paired or tokens:
        log.debug("tagged events: %d wait(s) paired with %d record(s)", paired, len(tokens))
    return paired
