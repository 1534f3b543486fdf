"""``torchair.ops``: record / wait / npu_wait_tensor and tagged events for model code."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from airstream.ops import tagged

__all__ = [
    "npu_create_tagged_event",
    "npu_print",
    "npu_record_tagged_stream",
    "npu_tagged_event_record",
    "npu_tagged_event_wait",
    "npu_wait_tensor",
    "record",
    "wait",
]


def record() -> torch.Tensor:
    """An event token for everything issued so far on the current stream."""
    return torch.ops.air.record()


def wait(tensors: Sequence[torch.Tensor]) -> None:
    """Order later work on the current stream after each token / tensor producer."""
    # TorchAir's wording first (its tests match on it), then what was wrong
    if not isinstance(tensors, (list, tuple)) or len(tensors) == 0:
        raise ValueError(
            "torchair.ops.wait() requires at least one tensor input: a non-empty list of tensors "
            f"(record tokens or data), got {tensors!r}"
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise ValueError(
                "arguments of torchair.ops.wait() must be torch.Tensor: element "
                f"{i} is {type(t).__name__}"
            )
    torch.ops.air.wait(list(tensors))


def npu_wait_tensor(self: torch.Tensor, dependency: torch.Tensor) -> torch.Tensor:
    """``self``, with every consumer ordered after ``dependency``'s producer."""
    return torch.ops.air.wait_tensor(self, dependency)


def npu_create_tagged_event(tag: str) -> tagged.TaggedEvent:
    """A process-wide event named ``tag`` (a tag in use raises ``ValueError``)."""
    return tagged.create_tagged_event(tag)


def npu_tagged_event_record(event: tagged.TaggedEvent) -> None:
    """Record ``event`` on the current stream (compiled: the start of an ordering edge)."""
    torch.ops.air.tagged_event_record(tagged.tag_of(event))


def npu_tagged_event_wait(event: tagged.TaggedEvent) -> None:
    """Make the current stream wait for the last record of ``event``."""
    torch.ops.air.tagged_event_wait(tagged.tag_of(event))


def npu_record_tagged_stream(input: torch.Tensor, tagged_stream: str) -> None:
    """Tell the caching allocator that ``input`` is used on the stream named ``tagged_stream``."""
    torch.ops.air.record_tagged_stream(input, tagged_stream)


def _check_print(args: tuple[object, ...], summarize_size: object, tensor_detail: object) -> None:
    for i, arg in enumerate(args):
        if not isinstance(arg, (torch.Tensor, str, bool, float, int)):
            raise TypeError(
                "position arguments of npu_print() must be torch.Tensor or basic type in "
                f"(str, bool, float, int), but got '{type(arg).__name__}' at position {i}"
            )
    if not any(isinstance(arg, torch.Tensor) for arg in args):
        raise ValueError("npu_print() requires at least one tensor input")
    if not isinstance(summarize_size, int):
        raise TypeError(f"summarize_size must be int, got {type(summarize_size).__name__}")
    if summarize_size < -1 or summarize_size == 0:
        raise ValueError(
            f"summarize_size must be positive or -1 for all elements, got {summarize_size}"
        )
    if not isinstance(tensor_detail, bool):
        raise TypeError(f"tensor_detail must be bool, got {type(tensor_detail).__name__}")


def npu_print(*args: object, summarize_size: int = 3, tensor_detail: bool = False) -> None:
    """Print ``args`` joined by spaces, tensors summarized (``summarize_size`` values from each
    end of every dim; -1 for all); ``tensor_detail`` adds each tensor's shape and dtype. In a
    compiled graph the print runs in program order, with the values at that point."""
    _check_print(args, summarize_size, tensor_detail)
    plain = " ".join("[]" if isinstance(a, torch.Tensor) else str(a) for a in args)
    placeholder, i = "{}", 0
    while placeholder in plain:  # a placeholder that the text itself does not contain
        placeholder, i = f"{{{i}}}", i + 1
    parts = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            parts.append(str(a))
        elif tensor_detail:
            parts.append(f"tensor({placeholder}, shape={placeholder}, dtype={a.dtype})")
        else:
            parts.append(placeholder)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    torch.ops.air.print(tensors, " ".join(parts), placeholder, summarize_size, tensor_detail)


_NPUGRAPH_EX_SCHEMAS = {
    "scope_enter": "scope_enter(str[] keys, str[] values, bool need_execute=False) -> ()",
    "scope_exit": "scope_exit(bool need_execute=False) -> ()",
    "record": "record(*, Device? device=None) -> Tensor",
    "wait": "wait(Tensor[] x) -> ()",
    "wait_tensor": "wait_tensor(Tensor self, Tensor dependency) -> Tensor",
}
_npugraph_ex_lib: list[torch.library.Library] = []


def define_npugraph_ex_ops() -> None:
    """``torch.ops.npugraph_ex.scope_enter/scope_exit/record/wait/wait_tensor``, the names
    TorchAir's npugraph_ex package gives the air ops (TorchAir e27ea807), for passes written
    against it; each runs as its air op, and airstream's pass manager reads them as the air ops.
    Defined once, and only where no torch_npu defined them."""
    from torch.fx.node import has_side_effect

    if _npugraph_ex_lib or hasattr(torch.ops.npugraph_ex, "scope_enter"):
        return
    lib = torch.library.Library("npugraph_ex", "FRAGMENT")
    for name, schema in _NPUGRAPH_EX_SCHEMAS.items():
        air_op = getattr(torch.ops.air, name).default
        lib.define(schema)
        lib.impl(name, air_op, "CompositeExplicitAutograd")
        torch.library.register_fake(f"npugraph_ex::{name}", air_op, lib=lib)
        has_side_effect(getattr(torch.ops.npugraph_ex, name).default)
    _npugraph_ex_lib.append(lib)
