"""The split graph run on fake tensors before it replaces the graph: every op must run, every
value the merged batch computes must have its original shape, and every copy of a value that
holds rows must hold its micro-batch's rows, at the graph's own token count (a dynamic graph's,
its example value and the next, so an odd count is seen too). A split the rules would accept
but that would fail when it runs is refused here, at compile time, naming the op."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from airstream.graph.nodes import describe
from airstream.passes.auto.microbatch_rebuild import Rebuilt
from airstream.passes.auto.microbatch_region import Refused, Region, Tokens
from airstream.passes.auto.token_labels import Positions, Rows
from airstream.torch_internals import (
    FakeTensorMode,
    collective_op_name,
    real_tensors,
    size_at,
    size_hint,
)

__all__ = ["check_split"]


def check_split(gm: torch.fx.GraphModule, rebuilt: Rebuilt, tokens: Tokens, region: Region) -> None:
    """Raise :class:`Refused` where the split graph would fail or compute a value of another
    shape than it should."""
    counts = [tokens.count]
    if isinstance(tokens.count, torch.SymInt):
        hint = size_hint(tokens.count)
        counts = [hint, hint + 1]
    for count in counts:
        _run(gm, rebuilt, tokens, region, count)


def _run(
    gm: torch.fx.GraphModule,
    rebuilt: Rebuilt,
    tokens: Tokens,
    region: Region,
    count: int,
) -> None:
    symbol = tokens.count.node.expr if isinstance(tokens.count, torch.SymInt) else None
    assigned = {symbol: count} if symbol is not None else {}

    def concrete(size: Any) -> int:
        return size_at(size, assigned)

    halves = (count // 2, count - count // 2)
    values: dict[torch.fx.Node, Any] = {}
    with real_tensors(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        for node in rebuilt.graph.nodes:
            try:
                values[node] = _value(node, values, gm, concrete, mode)
            except Exception as exc:  # the op cannot run on these values
                raise Refused(
                    f"the split graph would fail at {describe(node)} with {count} tokens "
                    f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                    "this graph is beyond what the pass can split (please report it)"
                ) from exc
            want = _expected(node, rebuilt, region, concrete, halves)
            got = values[node]
            if want is not None and isinstance(got, torch.Tensor) and tuple(got.shape) != want:
                raise Refused(
                    f"{describe(node)} would hold a value of shape {tuple(got.shape)} where "
                    f"{want} was due with {count} tokens; this graph is beyond what the pass "
                    "can split (please report it)"
                )


def _value(
    node: torch.fx.Node,
    values: dict[torch.fx.Node, Any],
    gm: torch.fx.GraphModule,
    concrete: Callable[[Any], int],
    mode: Any,
) -> Any:
    if node.op == "placeholder":
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            size = [concrete(s) for s in val.shape]
            stride = [concrete(s) for s in val.stride()]
            return torch.empty_strided(size, stride, dtype=val.dtype, device=val.device)
        if isinstance(val, torch.SymInt):
            return concrete(val)
        return val
    if node.op == "get_attr":
        return operator.attrgetter(str(node.target))(gm)
    if node.op == "output":
        return None
    args = torch.fx.map_arg(node.args, lambda a: values[a])
    kwargs = torch.fx.map_arg(node.kwargs, lambda a: values[a])
    if collective_op_name(node.target) == "all_to_all_single":
        _check_splits(args)  # fake tensors do not check them
    return node.target(*args, **kwargs)  # type: ignore[operator]


def _check_splits(args: Any) -> None:
    rows, outputs, inputs = args[0].shape[0], args[1], args[2]
    if sum(inputs) != rows or sum(outputs) != rows:
        raise RuntimeError(f"split sizes {list(inputs)}, {list(outputs)} of {rows} rows")


def _expected(
    node: torch.fx.Node,
    rebuilt: Rebuilt,
    region: Region,
    concrete: Callable[[Any], int],
    halves: tuple[int, int],
) -> tuple[int, ...] | None:
    """The shape ``node`` must have: a micro-batch's rows where its original held rows, the
    original's shape where it is a copy of a shared or merged op; None where it may differ."""
    copied = rebuilt.copies.get(node)
    if copied is not None:
        old, i = copied
        lab, val = region.labels.get(old), old.meta.get("val")
        if not isinstance(val, torch.Tensor) or not isinstance(lab, (Rows, Positions)):
            return None
        size = [concrete(s) for s in val.shape]
        dim, (per, blocks) = (lab.dim, lab.layout) if isinstance(lab, Rows) else (0, lab.fine)
        size[dim] = per * blocks * halves[i]
        return tuple(size)
    original = rebuilt.whole.get(node)
    val = (
        original.meta.get("val")
        if original is not None and original.op == "call_function"
        else None
    )
    if not isinstance(val, torch.Tensor):
        return None
    return tuple(concrete(s) for s in val.shape)
