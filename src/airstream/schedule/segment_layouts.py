"""The layouts a compiled segment hands its values on in (``schedule/fuse.py``): each output
must have the strides its readers (the next segment, an aten op, the caller) were compiled or
traced for. The decomposed segment is given them back where a decomposition changed them
(:func:`restore_layouts`), and a compiled segment whose outputs Inductor still returns in other
strides is refused (:func:`check_layouts`, :class:`LayoutMismatch`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from airstream.graph.layouts import dense_order, hints, same_layout
from airstream.schedule.segment_cut import SegmentOutput

__all__ = ["LayoutMismatch", "check_layouts", "restore_layouts", "wanted_strides"]


def wanted_strides(sub: torch.fx.GraphModule) -> list[tuple[Any, ...] | None]:
    """The strides each output of a segment is read in: its value's recorded strides (the next
    segment, an aten op and the caller were compiled or traced for them); None: not a tensor."""
    (sub_output,) = sub.graph.find_nodes(op="output")
    return [
        val.stride()
        if isinstance(val := getattr(arg, "meta", {}).get("val"), torch.Tensor)
        else None
        for arg in sub_output.args[0]
    ]


def restore_layouts(
    decomposed: torch.fx.GraphModule, wanted: Sequence[Any], fake_mode: Any
) -> None:
    """Give each output of the decomposed segment the layout its readers were compiled for.

    Inductor's decompositions may change a layout (``cat`` of an empty tensor and ``x`` becomes
    ``x.clone()``, which keeps a transposed ``x``'s strides where aten's ``cat`` returns a
    contiguous tensor), and before torch 2.15 Inductor takes the strides it must return from
    the decomposed graph, not from the output node's ``original_output_strides``. So a
    differing dense output is made in the wanted order by construction: permuted so that the
    order is the natural one, made contiguous, permuted back. Inductor fuses that copy into the
    kernel producing the value; the graph states the layout, so Inductor's FX graph cache key
    covers it. A layout no copy can have (broadcast, gaps) is left to the check after the
    compile."""
    (output,) = decomposed.graph.find_nodes(op="output")
    values = list(output.args[0])
    changed = False
    for index, (node, want) in enumerate(zip(values, wanted, strict=True)):
        val = getattr(node, "meta", {}).get("val")
        if want is None or not isinstance(val, torch.Tensor):
            continue
        if same_layout(val.shape, val.stride(), want):
            continue
        order = dense_order(val.shape, want)
        if order is None:
            continue
        inverse = sorted(range(len(order)), key=order.__getitem__)
        graph, aten = decomposed.graph, torch.ops.aten
        with graph.inserting_before(output):
            permuted = graph.call_function(aten.permute.default, (node, order))
            dense = graph.call_function(
                aten.clone.default, (permuted,), {"memory_format": torch.contiguous_format}
            )
            restored = graph.call_function(aten.permute.default, (dense, inverse))
        with fake_mode:
            permuted.meta["val"] = val.permute(order)
            dense.meta["val"] = permuted.meta["val"].clone(memory_format=torch.contiguous_format)
            restored.meta["val"] = dense.meta["val"].permute(inverse)
        values[index] = restored
        changed = True
    if changed:
        output.args = (tuple(values),)
        decomposed.recompile()


class LayoutMismatch(RuntimeError):
    """Inductor returns a segment's output in strides its readers were not compiled for."""


def check_layouts(
    sub: torch.fx.GraphModule,
    wanted: Sequence[Any],
    returned: Sequence[tuple[int, ...] | None] | None,
    outputs: Sequence[SegmentOutput],
    members: Sequence[torch.fx.Node],
) -> None:
    """Refuse a compiled segment that would hand a value on in strides other than the ones its
    readers (the next segment, an aten op, the caller) were compiled for: it runs as aten code
    instead, and nothing reads a value in a layout it was not compiled for."""
    if returned is None:
        return
    (sub_output,) = sub.graph.find_nodes(op="output")
    for arg, want, got, out in zip(sub_output.args[0], wanted, returned, outputs, strict=True):
        val = arg.meta.get("val")
        if want is None or got is None or not isinstance(val, torch.Tensor):
            continue
        if not same_layout(val.shape, got, want):
            outside = [u for u in out.node.users if u not in members]
            readers = ", ".join(sorted(u.name for u in outside))
            name = out.node.name if out.index is None else f"{out.node.name}[{out.index}]"
            raise LayoutMismatch(
                f"Inductor returns {name} (shape {hints(val.shape)}) in strides "
                f"{tuple(got)} where its readers ({readers}) were compiled for {hints(want)}"
            )
