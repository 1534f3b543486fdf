"""Graphviz DOT text for an FX graph with its streams, control edges and planner syncs."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from airstream.debug.report import native_call_text
from airstream.graph.nodes import (
    INSERTED_BY_KEY,
    segment_of,
    source_line,
    target_name,
    torch_function_name,
)
from airstream.graph.streams import StreamAssignment
from airstream.ops.library import (
    STREAM_LABEL_KEY,
    record,
    scope_enter,
    scope_exit,
    wait,
    wait_tensor,
)
from airstream.schedule.plan import StreamPlan
from airstream.torch_internals import OpOverload, OpOverloadPacket, op_name

__all__ = ["PALETTE", "marker_of", "op_label", "to_dot"]

PALETTE = ("#a6cee3", "#fdbf6f", "#b2df8a", "#fb9a99", "#cab2d6", "#ffff99", "#8dd3c7", "#fccde5")

_MARKERS = (scope_enter, scope_exit, record, wait)


# Drawn order edges: markers attached to the nodes they bracket or order.
_ORDER_STYLE = 'style=dashed, color="#777777", fontcolor="#555555"'


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _stream_name(label: str | None) -> str:
    return "main" if label is None else label


def marker_of(node: torch.fx.Node) -> Any:
    """The air marker op (scope_enter, scope_exit, record, wait) ``node`` calls, or None; the
    Dynamo graph calls the op packets, the aten graphs their default overloads."""
    if node.op != "call_function":
        return None
    target: Any = node.target
    if isinstance(target, OpOverloadPacket):
        target = getattr(target, "default", None)
    return next((m for m in _MARKERS if target is m), None)


def op_label(node: torch.fx.Node) -> str:
    """What ``node`` calls, named as people write it: ``aten.mm`` (the overload shown when not
    ``default``: ``aten.sub.Tensor``), ``torch.mm`` or ``operator.add`` for the Dynamo graph's
    torch functions, ``Tensor.relu`` for a method call."""
    if node.op == "call_method":
        return target_name(node)
    if node.op == "call_module":
        return f"module {node.target}"
    target = node.target
    if node.op != "call_function" or segment_of(node) is not None:
        return target_name(node)
    if isinstance(target, OpOverload):
        namespace, name, overload = op_name(target)
        return f"{namespace}.{name}" if overload == "default" else f"{namespace}.{name}.{overload}"
    if isinstance(target, OpOverloadPacket):
        return target_name(node)
    return torch_function_name(target) or target_name(node)


def _scope_text(node: torch.fx.Node) -> str:
    """``scope_enter`` with the stream it opens and its other keys, or ``scope_exit``."""
    if marker_of(node) is scope_exit:
        return "scope_exit"
    keys: Any = node.kwargs.get("keys", node.args[0] if node.args else ())
    values: Any = node.kwargs.get("values", node.args[1] if len(node.args) > 1 else ())
    pairs = dict(zip(keys or (), values or (), strict=False))
    label = pairs.pop(STREAM_LABEL_KEY, None)
    lines = ["scope_enter"] + ([f"stream {label}"] if label is not None else [])
    return "\n".join(lines + [f"{k}={v}" for k, v in pairs.items()])


def _calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The graph's call_function nodes, in order."""
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _order_edge(src: torch.fx.Node, dst: torch.fx.Node, label: str) -> str:
    return f"  {_q(src.name)} -> {_q(dst.name)} [{_ORDER_STYLE}, label={_q(f' {label} ')}];"


def _scope_edges(gm: torch.fx.GraphModule) -> list[str]:
    """scope_enter -> the first node in its scope and the last one -> scope_exit (enter -> exit
    for an empty scope); a nested scope's markers are members of the scope around it."""
    lines: list[str] = []
    stack: list[list[torch.fx.Node]] = [[]]  # per open scope: its scope_enter, then its nodes
    for node in _calls(gm):
        kind = marker_of(node)
        if kind is scope_exit and len(stack) > 1:
            enter, *members = stack.pop()
            if members:
                lines += [
                    _order_edge(enter, members[0], "first"),
                    _order_edge(members[-1], node, "last"),
                ]
            else:
                lines.append(_order_edge(enter, node, "empty scope"))
        stack[-1].append(node)
        if kind is scope_enter:
            stack.append([node])
    return lines


def _sequence_edges(gm: torch.fx.GraphModule, streams: StreamAssignment | None) -> list[str]:
    """The op a record follows -> record (what its token stands for) and wait -> the op its
    stream runs next; ops are the non-marker nodes on the marker's stream."""

    def stream(node: torch.fx.Node) -> str | None:
        return streams.stream_of.get(node.name) if streams is not None else None

    nodes = _calls(gm)
    lines: list[str] = []
    for i, node in enumerate(nodes):
        kind = marker_of(node)
        if kind is record:
            ops = [n for n in nodes[:i] if marker_of(n) is None and stream(n) == stream(node)]
            if ops:
                lines.append(_order_edge(ops[-1], node, "after"))
        elif kind is wait:
            later = (
                n for n in nodes[i + 1 :] if marker_of(n) is None and stream(n) == stream(node)
            )
            if (then := next(later, None)) is not None:
                lines.append(_order_edge(node, then, "then"))
    return lines


def _node_attrs(
    node: torch.fx.Node, label: str | None, colour: dict[str | None, str]
) -> dict[str, str]:
    """Shape, colour, text and tooltip of one node."""
    inserted = node.meta.get(INSERTED_BY_KEY)
    tooltip = source_line(node) or (f"inserted by pass {inserted}" if inserted else node.name)
    attrs = {"tooltip": tooltip}
    fill = colour.get(label, "white")
    kind = marker_of(node)
    if node.op in ("placeholder", "output", "get_attr"):
        attrs.update(shape="ellipse", fillcolor="white", label=node.name)
    elif kind in (scope_enter, scope_exit):
        attrs.update(shape="cds", fillcolor="#eeeeee", label=_scope_text(node))
    elif kind is not None:
        attrs.update(shape="diamond", fillcolor=fill, label=f"{node.name}\n[{_stream_name(label)}]")
    elif (seg := segment_of(node)) is not None:  # max-autotune: what Inductor fused
        attrs.update(
            fillcolor=fill,
            peripheries="2",
            label=f"{node.name}\n"
            + "\n".join(seg.kernels)
            + f"\nfused {seg.segment.ops} ops\n[{_stream_name(label)}]",
            tooltip=f"fused: {', '.join(seg.segment.nodes)}",
        )
    else:
        text = native_call_text(node) or op_label(node)  # a torch stream op: its streams by name
        attrs.update(fillcolor=fill, label=f"{node.name}\n{text}\n[{_stream_name(label)}]")
    return attrs


def to_dot(
    gm: torch.fx.GraphModule,
    streams: StreamAssignment | None,
    plan: StreamPlan | None = None,
    title: str = "",
) -> str:
    """DOT text: nodes coloured by stream (legend included) and named by their aten (or torch)
    op, data edges solid, control edges (record -> wait, wait_tensor dependency) dashed, the
    markers attached by grey dashed edges to what they bracket or order (scope_enter -> first
    node, last node -> scope_exit, the op a record follows -> record, wait -> the op after it),
    planner syncs bold red and labelled, each node's source line as its tooltip."""
    labels = list(streams.streams) if streams is not None else [None]
    colour = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}
    lines = [
        "digraph airstream {",
        f"  label={_q(title)}; labelloc=t; fontname=Helvetica;",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10];',
        "  edge [fontname=Helvetica, fontsize=9];",
        "  subgraph cluster_legend {",
        '    label="streams"; style=dashed;',
    ]
    for label in labels:
        lines.append(
            f"    legend_{len(lines)} [label={_q(_stream_name(label))}, "
            f"fillcolor={_q(colour[label])}];"
        )
    lines.append("  }")
    for node in gm.graph.nodes:
        label = streams.stream_of.get(node.name) if streams is not None else None
        body = ", ".join(f"{k}={_q(v)}" for k, v in _node_attrs(node, label, colour).items())
        lines.append(f"  {_q(node.name)} [{body}];")
    for node in gm.graph.nodes:
        control: set[torch.fx.Node] = set()
        if marker_of(node) is wait:
            control = {n for n in node.args[0] if isinstance(n, torch.fx.Node)}
        elif node.target is wait_tensor:
            control = {node.args[1]}
        for arg in node.all_input_nodes:
            style = ' [style=dashed, color="#555555", label="control"]' if arg in control else ""
            lines.append(f"  {_q(arg.name)} -> {_q(node.name)}{style};")
    lines += _scope_edges(gm) + _sequence_edges(gm, streams)
    if plan is not None:
        for sync in plan.syncs:
            if sync.automatic:
                text = f"sync e{sync.event} ({sync.reason})"
                lines.append(
                    f"  {_q(sync.producer.name)} -> {_q(sync.consumer.name)} "
                    f"[style=bold, color=red, fontcolor=red, label={_q(text)}, constraint=false];"
                )
    lines.append("}")
    return "\n".join(lines) + "\n"
