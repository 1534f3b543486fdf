"""airstream's stream program written back in PyTorch's stream IR, for Inductor.

:func:`write_torch_streams` takes a graph whose streams airstream's form says (scope markers, the
``air_stream`` annotation, record/wait) and writes the same program the way Dynamo writes a
``torch.Stream`` model: each side stream a stream object of the graph (registered so the graph's
bytecode builds it before every call), its nodes annotated with it (``node.meta["custom"]``),
and every ordering the planner would make (data, control, mutation, RNG, collective order, the
join) an explicit ``torch.ops.streams.record_event``/``wait_event`` pair, because PyTorch's IR,
unlike airstream's, synchronizes nothing by itself. Each side stream starts after the caller's
stream (``wait_stream`` at the top) and the caller's stream waits for it at the end (the plan's
join). The air ops are then removed. Inductor's user-stream code generation runs the result
(one CUDA stream per object, no fusion or buffer reuse across them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from airstream import torch_internals
from airstream.graph.devices import graph_device
from airstream.graph.streams import assign_streams
from airstream.ops.library import AIR_OPS, record, scope_enter, scope_exit, wait, wait_tensor
from airstream.ops.torch_streams import CPU_STREAM_HOME, TorchStreams, current_stream
from airstream.schedule.plan import Record, Run, Wait, build_plan

__all__ = ["TorchStreamsWritten", "write_torch_streams"]


@dataclass(frozen=True)
class TorchStreamsWritten:
    """What :func:`write_torch_streams` wrote: each stream's registry index (main: the caller's
    current stream), and how many events it recorded and waited for."""

    streams: dict[str | None, int]
    records: int
    waits: int


def _main_index(device: torch.device) -> int:
    """The registry index of the caller's current stream: the one Dynamo registered while
    tracing, else one registered now."""
    table = TorchStreams.from_registry()
    for index, label in table.labels.items():
        if label is None and table.device(index) == device.type:
            return index
    return torch_internals.register_current_stream(device, current_stream("cpu"), CPU_STREAM_HOME)


def _insert(
    graph: torch.fx.Graph,
    where: torch.fx.Node,
    after: bool,
    op: str,
    args: tuple,
    index: int | None,
) -> torch.fx.Node:
    with graph.inserting_after(where) if after else graph.inserting_before(where):
        node = graph.call_function(torch_internals.streams_op(op), args)
    if index is not None:
        torch_internals.set_dynamo_stream_index(node, index)
    return node


def write_torch_streams(gm: torch.fx.GraphModule) -> TorchStreamsWritten:
    """Rewrite ``gm``'s air-form stream program in PyTorch's stream IR, in place (see the
    module docstring). A graph with no side stream is left as it is."""
    torch_internals.require("torch-streams")
    streams = assign_streams(gm)
    plan = build_plan(gm, streams)
    graph = gm.graph
    sides = [s.label for s in plan.side_streams if s.runs]
    if not sides:
        return TorchStreamsWritten({}, 0, 0)
    device = graph_device(gm)
    index: dict[str | None, int] = {None: _main_index(device)}
    for label in sides:
        index[label] = torch_internals.new_torch_stream(device)
    events = {e: torch_internals.new_torch_event(device) for e in range(plan.num_events)}
    output = next(iter(graph.find_nodes(op="output")))
    first = next(n for n in graph.nodes if n.op != "placeholder")
    records = waits = 0
    for label in sides:  # each side stream starts after the caller's work
        _insert(graph, first, False, "wait_stream", (index[label], index[None]), None)
    for steps in plan.streams:
        if steps.label not in index:
            continue
        here = index[steps.label]
        # the nodes of the caller's stream carry no annotation (as Dynamo writes them)
        mark = None if steps.label is None else here
        last: torch.fx.Node | None = None
        pending: list[int] = []
        for step in steps.steps:
            if isinstance(step, Run):
                for event in pending:
                    _insert(graph, step.node, False, "wait_event", (events[event], here), mark)
                    waits += 1
                pending, last = [], step.node
            elif isinstance(step, Record):
                at, after = (last, True) if last is not None else (first, False)
                last = _insert(graph, at, after, "record_event", (events[step.event], here), mark)
                records += 1
            elif isinstance(step, Wait):
                pending.append(step.event)
        for event in pending:  # the join: the caller's stream waits before the output
            _insert(graph, output, False, "wait_event", (events[event], here), mark)
            waits += 1
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        label = streams.stream_of.get(node.name)
        if label is not None and node.target not in AIR_OPS:
            torch_internals.set_dynamo_stream_index(node, index[label])
    _remove_air_ops(graph)
    torch_internals.wrap_sync_nodes(gm)  # as AOTAutograd leaves them: kept in place
    graph.lint()
    gm.recompile()
    return TorchStreamsWritten({label: i for label, i in index.items()}, records, waits)


def _remove_air_ops(graph: torch.fx.Graph) -> None:
    """Drop the markers and record/wait (their ordering is now native events);
    ``wait_tensor(a, dep)`` is ``a``."""
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function":
            continue
        if node.target is wait_tensor:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif node.target in (scope_enter, scope_exit, wait) or (
            node.target is record and not node.users
        ):
            graph.erase_node(node)
