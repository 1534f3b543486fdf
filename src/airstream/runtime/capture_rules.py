"""What keeps a graph from CUDA graph capture (``mode="reduce-overhead"``), read from the graph
before any capture is tried: :func:`capture_blockers` gives the reasons, each naming its node or
input; :func:`written_inputs` the inputs a graph writes (a captured graph may write only
parameters and buffers, which the replay reads where they are)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from airstream.graph.effect_queries import alias_classes
from airstream.graph.effects import effects
from airstream.graph.nodes import describe
from airstream.ops.torch_streams import NATIVE_HOST_SYNCS

__all__ = ["capture_blockers", "written_inputs"]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, list | tuple):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _symbolic(val: Any) -> bool:
    if isinstance(val, _SYMBOLIC):
        return True
    if isinstance(val, list | tuple):
        return any(_symbolic(v) for v in val)
    if isinstance(val, torch.Tensor):
        return any(isinstance(d, _SYMBOLIC) for d in (*val.shape, *val.stride()))
    return False


def written_inputs(gm: torch.fx.GraphModule) -> dict[int, torch.fx.Node]:
    """The inputs ``gm`` writes in place (through a view of them too): input index -> the first
    node writing it."""
    classes = alias_classes(gm.graph)
    index = {node: i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))}
    written: dict[int, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        for target in effects(node).writes:
            i = index.get(classes.get(target, target))
            if i is not None:
                written.setdefault(i, node)
    return written


def capture_blockers(
    gm: torch.fx.GraphModule,
    static: Collection[int] = (),
    stream_of: Mapping[torch.fx.Node, str | None] | None = None,
) -> list[str]:
    """Why ``gm`` cannot be captured into a CUDA graph (empty if it can). ``static``: the indices
    of the inputs that are parameters and buffers, which a captured graph may write;
    ``stream_of``: each node's stream (None: main), where a collective must stay on main (the
    process group's communication stream joins the capture from the stream that issues it, and
    side-stream collectives under replay are what serving stacks found corrupting output)."""
    reasons: list[str] = []
    devices: dict[torch.device, torch.fx.Node] = {}
    placeholders = gm.graph.find_nodes(op="placeholder")
    for i, writer in written_inputs(gm).items():
        if i not in static:
            reasons.append(
                f"{describe(writer)} writes input {placeholders[i].name}, which is not a "
                "parameter or buffer (a replay reads such an input from the graph's own copy)"
            )
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        val = node.meta.get("val")
        name = f"input {node.name}" if node.op == "placeholder" else describe(node)
        if _symbolic(val):
            if free_unbacked_symbols(val):
                reasons.append(f"{name} has a shape that depends on tensor values")
            else:
                reasons.append(f"symbolic shape at {name}")
        for tensor in _tensors(val):
            if tensor.device.type != "cuda":
                reasons.append(f"{name} is on {tensor.device}")
                break
            devices.setdefault(tensor.device, node)
        if node.op == "call_function":
            found = effects(node)
            if found.random:
                reasons.append(f"{name} draws random numbers")
            stream = stream_of.get(node) if stream_of is not None else None
            if found.collective and stream is not None:
                reasons.append(
                    f"{name} is a collective on stream {stream!r}: under capture collectives run "
                    "on the main stream only (place it there, or use mode='max-autotune')"
                )
            if found.host_sync and node.target in NATIVE_HOST_SYNCS:
                reasons.append(f"{name} makes the host wait for the device (a synchronize)")
            elif found.host_sync:
                reasons.append(f"{name} reads device data back to the host")
    if len(devices) > 1:
        where = ", ".join(f"{d} ({n.name})" for d, n in devices.items())
        reasons.append(f"values on more than one device: {where}")
    return reasons
