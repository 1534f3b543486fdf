"""``air::print``: TorchAir's ``npu_print`` as an op, so a print stays in the compiled graph in
program order (it reads the tensors' values at that point) and runs on the stream it is on.

``air::print(Tensor[] tensors, str msg_format, str placeholder, int summarize_size,
bool tensor_detail) -> ()``: each ``placeholder`` in ``msg_format`` is replaced, in order, by a
tensor's summary (and, with ``tensor_detail``, its shape); the line goes to stdout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx.node import has_side_effect

__all__ = ["air_print", "summarize"]


def _number(v: Any) -> str:
    v = float(v)
    return f"{v:.0f}" if v.is_integer() else f"{v:.9g}"


def _summarize_list(values: Any, edge: int) -> str:
    if not isinstance(values, list):
        return _number(values)
    show_all = edge < 0 or len(values) <= 2 * edge
    parts = values if show_all else [*values[:edge], "...", *values[len(values) - edge :]]
    nested = bool(values) and isinstance(values[0], list)
    texts = [p if p == "..." else _summarize_list(p, edge) for p in parts]
    return "[" + ("\n ".join(texts) if nested else " ".join(texts)) + "]"


def summarize(tensor: torch.Tensor, summarize_size: int) -> str:
    """``tensor``'s values, ``summarize_size`` from each end of every dim (-1: all of them)."""
    if summarize_size < -1 or summarize_size == 0:
        raise ValueError(
            f"summarize_size must be positive or -1 for all elements, got {summarize_size}"
        )
    t = tensor.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.float()
    return _summarize_list(t.cpu().tolist(), summarize_size)


_lib = torch.library.Library("air", "FRAGMENT")
_lib.define(
    "print(Tensor[] tensors, str msg_format, str placeholder, int summarize_size, "
    "bool tensor_detail) -> ()"
)


def _print(
    tensors: Sequence[torch.Tensor],
    msg_format: str,
    placeholder: str,
    summarize_size: int,
    tensor_detail: bool,
) -> None:
    text = msg_format
    for t in tensors:
        text = text.replace(placeholder, summarize(t, summarize_size), 1)
        if tensor_detail:
            text = text.replace(placeholder, str(list(t.shape)), 1)
    print(text, flush=True)


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


_lib.impl("print", _print, "CompositeExplicitAutograd")
torch.library.register_fake("air::print", _nothing, lib=_lib)
air_print = torch.ops.air.print.default
has_side_effect(air_print)
