"""Cost models for automatic stream assignment: seconds per node.

``flops``: torch's flop counter formulas (``torch.utils.flop_counter``) on the node's metadata,
plus a bytes term for memory traffic and a fixed dispatch cost, at nominal CPU rates. ``profile``:
each node run a few times on random inputs of its example shapes at compile time (fastest run,
1 intra-op thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from airstream.torch_internals import flop_formula, op_schema

__all__ = ["CostModel", "flops_cost", "profile_cost"]

CostModel = Callable[[torch.fx.Node], float]

# Nominal rates of one CPU core (the figures only need to rank work, not predict time exactly).
FLOPS_PER_SECOND = 40e9
BYTES_PER_SECOND = 8e9
DISPATCH_SECONDS = 3e-6


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        numel = value.numel()
        return (int(numel) if isinstance(numel, int) else 1 << 16) * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _val(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _is_view(target: Any) -> bool:
    """Ops whose result aliases an input (t, view, expand, ...): metadata only, no traffic."""
    schema = op_schema(target)
    return schema is not None and any(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )


def flops_cost(node: torch.fx.Node) -> float:
    """Estimated seconds for ``node``: flops + bytes moved + dispatch (views: dispatch only)."""
    if node.op != "call_function":
        return 0.0
    target = node.target
    if _is_view(target):
        return DISPATCH_SECONDS
    flops = 0
    formula = flop_formula(target)
    if formula is not None:
        try:
            args = torch.fx.map_arg(node.args, _val)
            kwargs = torch.fx.map_arg(node.kwargs, _val)
            flops = int(formula(*args, **kwargs, out_val=node.meta.get("val")))
        except Exception:  # a formula that cannot read these shapes: count bytes only
            flops = 0
    moved = _bytes(node.meta.get("val")) + sum(_bytes(_val(a)) for a in node.all_input_nodes)
    return DISPATCH_SECONDS + flops / FLOPS_PER_SECOND + moved / BYTES_PER_SECOND


def _materialize(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        shape = [int(d) if isinstance(d, int) else 8 for d in value.shape]
        if value.dtype.is_floating_point or value.dtype.is_complex:
            return torch.randn(shape, dtype=value.dtype)
        if value.dtype == torch.bool:
            return torch.zeros(shape, dtype=torch.bool)
        return torch.zeros(shape, dtype=value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_materialize(v) for v in value)
    if isinstance(value, torch.SymInt):
        return 8
    return value


def profile_cost(node: torch.fx.Node, repeats: int = 5) -> float:
    """Fastest of ``repeats`` runs of ``node`` (after one warm-up) on random inputs of its example
    shapes, with 1 intra-op thread as stream workers run; falls back to :func:`flops_cost` for
    nodes that cannot run that way."""
    if node.op != "call_function" or not callable(node.target):
        return 0.0
    threads = torch.get_num_threads()
    try:
        args = torch.fx.map_arg(node.args, lambda a: _materialize(_val(a)))
        kwargs = torch.fx.map_arg(node.kwargs, lambda a: _materialize(_val(a)))
        torch.set_num_threads(1)
        node.target(*args, **kwargs)  # type: ignore[operator]
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            node.target(*args, **kwargs)  # type: ignore[operator]
            samples.append(time.perf_counter() - start)
        return min(samples)
    except Exception:
        return flops_cost(node)
    finally:
        torch.set_num_threads(threads)
