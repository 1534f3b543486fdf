"""Text views of an optimized graph: each node's stream, and the record -> wait control edges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.fx

from airstream import torch_internals
from airstream.graph.nodes import segment_of, source_line, target_name
from airstream.graph.streams import StreamAssignment
from airstream.ops.library import record, scope_enter, scope_exit, wait, wait_tensor
from airstream.ops.torch_streams import TorchStreams, torch_streams_of

__all__ = [
    "ControlEdge",
    "control_edges",
    "format_segments",
    "format_streams",
    "native_call_text",
    "stream_name",
]


def stream_name(label: str | None) -> str:
    """Display name of a stream label (``main`` for the main stream)."""
    return "main" if label is None else label


@dataclass(frozen=True)
class ControlEdge:
    """An ordering edge that is not a data edge: ``source`` must finish before ``target`` starts."""

    kind: str  # "record->wait" or "wait_tensor"
    source: str
    source_stream: str | None
    target: str
    target_stream: str | None

    def __str__(self) -> str:
        return (
            f"{self.kind}: {self.source} [{stream_name(self.source_stream)}] -> "
            f"{self.target} [{stream_name(self.target_stream)}]"
        )


def control_edges(gm: torch.fx.GraphModule, streams: StreamAssignment) -> list[ControlEdge]:
    """The record->wait and wait_tensor edges of ``gm``, in graph order."""
    edges = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is wait:
            for dep in node.args[0]:
                kind = "record->wait" if dep.target is record else "tensor->wait"
                edges.append(
                    ControlEdge(
                        kind, dep.name, streams.stream(dep), node.name, streams.stream(node)
                    )
                )
        elif node.target is wait_tensor:
            dep = node.args[1]
            edges.append(
                ControlEdge(
                    "wait_tensor", dep.name, streams.stream(dep), node.name, streams.stream(node)
                )
            )
    return edges


def _arg_text(node: torch.fx.Node, position: int, arg: Any, table: TorchStreams | None) -> str:
    """An argument as the dump shows it: a torch stream op's stream and event indices by name."""
    if table is not None and isinstance(arg, int) and not isinstance(arg, bool):
        name = torch_internals.torch_stream_op(node.target)
        if name is not None and not (name == "synchronize_device" or position >= 2):
            return f"{table.name(arg)}"
        if name is None and torch_internals.is_external_object(node):
            return f"{arg} ({table.name(arg)})"
    return str(arg)


def native_call_text(node: torch.fx.Node) -> str | None:
    """A PyTorch stream-IR node as people read it, its streams and events by name
    (``streams.wait_stream(alt_stream, main)``, ``get_external_object_by_index(alt_stream)``);
    None for any other node, or without the graph's table."""
    gm = node.graph.owning_module
    table = torch_streams_of(gm) if isinstance(gm, torch.fx.GraphModule) else None
    if table is None or node.op != "call_function":
        return None
    if torch_internals.torch_stream_op(node.target) is None and not (
        torch_internals.is_external_object(node)
    ):
        return None
    args = ", ".join(_arg_text(node, i, a, table) for i, a in enumerate(node.args))
    return f"{target_name(node)}({args})"


def format_streams(gm: torch.fx.GraphModule, streams: StreamAssignment) -> str:
    """One line per node: stream, node, target and source line; markers shown as brackets.
    A torch stream op's streams and events (registry indices) are shown by their variable's name."""
    table = torch_streams_of(gm)
    width = max([len(stream_name(s)) for s in streams.streams] + [6])
    lines = [f"{'stream':<{width}}  node"]
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            outs = ", ".join(str(a) for a in torch.fx.node.map_arg(node.args[0], lambda n: n.name))
            lines.append(f"{'':<{width}}  return {outs}")
            continue
        label = stream_name(streams.stream(node)) if node.name in streams.stream_of else ""
        if node.target is scope_enter:
            text = f"[scope_enter {dict(zip(node.args[0], node.args[1], strict=True))}]"
        elif node.target is scope_exit:
            text = "[scope_exit]"
        else:
            args = ", ".join(_arg_text(node, i, a, table) for i, a in enumerate(node.args))
            text = f"{node.name} = {target_name(node)}({args})"
            segment = segment_of(node)
            if segment is not None:
                text += f"    # fused {', '.join(segment.segment.nodes)}"
        where = source_line(node)
        lines.append(f"{label:<{width}}  {text}" + (f"    # {where}" if where else ""))
    return "\n".join(lines)


def format_segments(segments: Sequence[Any]) -> str:
    """max-autotune: per stream, each segment's ops, kernels, compile time and cache state;
    segments that fell back to aten code with Inductor's error."""
    if not segments:
        return "max-autotune: no segment of 2 or more fusible ops"
    lines = [f"{'stream':<10}{'segment':<22}{'ops':>5}{'compile s':>11}  {'cache':<9}kernels"]
    for seg in sorted(segments, key=lambda s: (s.segment.stream is not None, s.segment.name)):
        kernels = ", ".join(seg.kernels) if seg.node is not None else f"aten ({seg.fallback})"
        lines.append(
            f"{stream_name(seg.segment.stream):<10}{seg.segment.name:<22}{seg.segment.ops:>5}"
            f"{seg.compile_s:>11.2f}  {seg.cache:<9}{kernels}"
        )
        lines.append(f"{'':<32}fused: {', '.join(seg.segment.nodes)}")
    total = sum(s.compile_s for s in segments)
    fallbacks = sum(1 for s in segments if s.node is None)
    lines.append(
        f"{len(segments)} segment(s), {total:.2f} s compiling, {fallbacks} fell back to aten code"
    )
    return "\n".join(lines)
