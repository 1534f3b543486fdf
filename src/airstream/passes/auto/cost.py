"""Cost models for automatic stream assignment: seconds per node.

``flops``: torch's flop counter formulas (``torch.utils.flop_counter``) on the node's metadata,
plus a bytes term for memory traffic and a fixed dispatch cost, at one machine's rates
(``airstream.machine.calibration``: measured on this machine, or nominal). ``profile``:
each node run a few times on random inputs of its example shapes at compile time (fastest run,
at the process's intra-op threads: the cost on one stream). Only pure nodes are run
(``airstream.graph.effects``): a random op, a write, a collective or an air op gets its ``flops``
estimate instead, and the inputs are drawn from a
private generator, so profiling leaves every random generator as it found it and issues no
communication.

Symbolic sizes (a graph compiled for dynamic shapes) are read through their example values
(``size_hint``), never with ``int()``: that would install a guard pinning the size, and every new
size would recompile. A graph gets the same costs whether it was traced static or dynamic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.graph.foreign_ops import foreign_flops
from airstream.graph.fusion import called_op
from airstream.machine.calibration import NOMINAL, MachineCosts
from airstream.torch_internals import flop_formula, op_name, size_hint

__all__ = ["CostModel", "flops_cost", "hinted", "profile_cost"]

CostModel = Callable[[torch.fx.Node, MachineCosts], float]


def _symbolic(value: torch.Tensor) -> bool:
    return any(not isinstance(d, int) for d in (*value.shape, *value.stride()))


def hinted(value: Any) -> Any:
    """``value`` with every symbolic size replaced by its example value (a tensor with symbolic
    sizes becomes a meta tensor of the example sizes); no guard is installed."""
    if isinstance(value, torch.Tensor):
        if not _symbolic(value):
            return value
        shape = [size_hint(d) for d in value.shape]
        stride = [size_hint(d) for d in value.stride()]
        return torch.empty_strided(shape, stride, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(hinted(v) for v in value)
    if isinstance(value, torch.SymInt):
        return size_hint(value)
    return value


def _bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return size_hint(value.numel()) * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 0


def _val(arg: Any) -> Any:
    return hinted(arg.meta.get("val")) if isinstance(arg, torch.fx.Node) else hinted(arg)


def flops_cost(node: torch.fx.Node, costs: MachineCosts = NOMINAL) -> float:
    """Estimated seconds for ``node`` at ``costs``' rates: flops + bytes moved + dispatch
    (views: dispatch only)."""
    if node.op != "call_function":
        return 0.0
    target = node.target
    if effects(node).view:  # metadata only (t, view, expand, ...): no traffic
        return costs.dispatch_seconds
    flops = 0
    formula = flop_formula(target)
    if formula is not None:
        try:
            args = torch.fx.map_arg(node.args, _val)
            kwargs = torch.fx.map_arg(node.kwargs, _val)
            flops = int(formula(*args, **kwargs, out_val=hinted(node.meta.get("val"))))
        except Exception:  # a formula that cannot read these shapes: count bytes only
            flops = 0
    elif (called := called_op(node)) is not None:  # another library's op (vLLM's), if known
        values = {k: _val(v) for k, v in called[1].items()}
        flops = foreign_flops(*op_name(called[0])[:2], values) or 0
    moved = _bytes(node.meta.get("val")) + sum(_bytes(_val(a)) for a in node.all_input_nodes)
    return costs.dispatch_seconds + flops / costs.flops_per_second + moved / costs.bytes_per_second


def _materialize(value: Any, generator: torch.Generator) -> Any:
    if isinstance(value, torch.Tensor):
        shape = [size_hint(d) for d in value.shape]
        if value.dtype.is_floating_point or value.dtype.is_complex:
            return torch.randn(shape, dtype=value.dtype, generator=generator)
        if value.dtype == torch.bool:
            return torch.zeros(shape, dtype=torch.bool)
        return torch.zeros(shape, dtype=value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_materialize(v, generator) for v in value)
    if isinstance(value, torch.SymInt):
        return size_hint(value)
    return value


def profile_cost(node: torch.fx.Node, costs: MachineCosts = NOMINAL, repeats: int = 5) -> float:
    """Fastest of ``repeats`` runs of ``node`` (after one warm-up) on random inputs of its example
    shapes, at the process's intra-op threads: its cost on one stream (a multi-stream prediction
    charges each matrix multiply the measured ``thread_slowdown`` on top); falls back to
    :func:`flops_cost` for nodes that cannot run that way and for nodes with effects beyond their
    result."""
    if node.op != "call_function" or not callable(node.target):
        return 0.0
    if not effects(node).pure:
        return flops_cost(node, costs)
    generator = torch.Generator().manual_seed(0)
    target: Callable[..., Any] = node.target
    try:
        args = torch.fx.map_arg(node.args, lambda a: _materialize(_val(a), generator))
        kwargs = torch.fx.map_arg(node.kwargs, lambda a: _materialize(_val(a), generator))
        with torch.random.fork_rng(devices=[]):  # an op drawing randomness untagged: undone
            target(*args, **kwargs)
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                target(*args, **kwargs)
                samples.append(time.perf_counter() - start)
        return min(samples)
    except Exception:
        return flops_cost(node, costs)
