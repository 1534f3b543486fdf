"""Graphviz DOT text for an FX graph with its streams, control edges and planner syncs."""

from __future__ import annotations

import torch.fx

from airstream.nodes import segment_of, source_line, target_name
from airstream.ops.library import record, scope_enter, scope_exit, wait, wait_tensor
from airstream.schedule.plan import StreamPlan
from airstream.schedule.streams import StreamAssignment

__all__ = ["PALETTE", "to_dot"]

PALETTE = ("#a6cee3", "#fdbf6f", "#b2df8a", "#fb9a99", "#cab2d6", "#ffff99", "#8dd3c7", "#fccde5")


def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _stream_name(label: str | None) -> str:
    return "main" if label is None else label


def to_dot(
    gm: torch.fx.GraphModule,
    streams: StreamAssignment | None,
    plan: StreamPlan | None = None,
    title: str = "",
) -> str:
    """DOT text: nodes coloured by stream (legend included), data edges solid, control edges
    (record -> wait, wait_tensor dependency) dashed, planner syncs bold red and labelled, each
    node's source line as its tooltip."""
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
        inserted = node.meta.get("air_inserted_by")
        tooltip = source_line(node) or (f"inserted by pass {inserted}" if inserted else node.name)
        attrs = {"tooltip": tooltip}
        if node.op in ("placeholder", "output", "get_attr"):
            attrs.update(shape="ellipse", fillcolor="white", label=node.name)
        elif node.target in (scope_enter, scope_exit):
            text = (
                "scope_exit"
                if node.target is scope_exit
                else (
                    "scope_enter "
                    + ", ".join(f"{k}={v}" for k, v in zip(*node.args[:2], strict=True))
                )
            )
            attrs.update(shape="cds", fillcolor="#eeeeee", label=text)
        elif node.target in (record, wait):
            attrs.update(shape="diamond", fillcolor=colour.get(label, "white"), label=node.name)
        elif (seg := segment_of(node)) is not None:  # max-autotune: what Inductor fused
            attrs.update(
                fillcolor=colour.get(label, "white"),
                peripheries="2",
                label=f"{node.name}\n"
                + "\n".join(seg.kernels)
                + f"\nfused {seg.segment.ops} ops\n[{_stream_name(label)}]",
                tooltip=f"fused: {', '.join(seg.segment.nodes)}",
            )
        else:
            attrs.update(
                fillcolor=colour.get(label, "white"),
                label=f"{node.name}\n{target_name(node)}\n[{_stream_name(label)}]",
            )
        body = ", ".join(f"{k}={_q(str(v))}" for k, v in attrs.items())
        lines.append(f"  {_q(node.name)} [{body}];")
    for node in gm.graph.nodes:
        control: set[torch.fx.Node] = set()
        if node.target is wait:
            control = set(node.args[0])
        elif node.target is wait_tensor:
            control = {node.args[1]}
        for arg in node.all_input_nodes:
            style = ' [style=dashed, color="#555555", label="control"]' if arg in control else ""
            lines.append(f"  {_q(arg.name)} -> {_q(node.name)}{style};")
    # A wait orders what its stream runs next: show that as a dotted edge.
    nodes = list(gm.graph.nodes)
    for i, node in enumerate(nodes):
        if node.target is not wait:
            continue
        label = streams.stream_of.get(node.name) if streams is not None else None
        for later in nodes[i + 1 :]:
            if later.op == "call_function" and later.target not in (scope_enter, scope_exit, wait):
                if streams is None or streams.stream_of.get(later.name) == label:
                    lines.append(
                        f'  {_q(node.name)} -> {_q(later.name)} [style=dotted, label="then"];'
                    )
                    break
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
