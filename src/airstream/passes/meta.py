"""Node metadata (``meta["val"]``) for nodes a pass added, and its re-check for ``verify_passes``.

Passes add nodes with ``graph.call_function`` and leave ``meta["val"]`` unset; stream analysis and
later passes need it. :func:`fill_meta` evaluates only the nodes that lack it, with the graph's own
FakeTensorMode (so dynamic shapes keep their symbols). :func:`check_meta` recomputes every node and
compares shape, dtype and device with what is recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from airstream.nodes import describe
from airstream.torch_internals import FakeTensor, FakeTensorMode, detect_fake_mode

__all__ = ["MetaError", "check_meta", "fake_mode_of", "fill_meta"]


class MetaError(RuntimeError):
    """A node's metadata is missing, cannot be computed, or disagrees with its inputs."""


def fake_mode_of(example_inputs: Sequence[Any]) -> FakeTensorMode:
    """The FakeTensorMode of the example inputs, or a fresh one when they are real tensors."""
    mode = detect_fake_mode(list(example_inputs))
    return mode if mode is not None else FakeTensorMode(allow_non_fake_inputs=True)


def _arg_val(node: torch.fx.Node, arg: torch.fx.Node) -> Any:
    if "val" not in arg.meta:
        raise MetaError(f"{describe(node)} uses {describe(arg)}, which has no meta['val']")
    return arg.meta["val"]


def _evaluate(gm: torch.fx.GraphModule, node: torch.fx.Node, mode: FakeTensorMode) -> Any:
    args = torch.fx.map_arg(node.args, lambda a: _arg_val(node, a))
    kwargs = torch.fx.map_arg(node.kwargs, lambda a: _arg_val(node, a))
    if node.op == "call_function":
        fn = node.target
    elif node.op == "call_method":
        self_obj, *rest = args
        args = tuple(rest)
        fn = getattr(self_obj, str(node.target))
    elif node.op == "call_module":
        fn = gm.get_submodule(str(node.target))
    elif node.op == "get_attr":
        value = gm
        for part in str(node.target).split("."):
            value = getattr(value, part)
        return mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
    else:
        raise MetaError(f"{describe(node)}: cannot compute metadata for a {node.op!r} node")
    with mode:
        return fn(*args, **kwargs)  # type: ignore[operator]


def fill_meta(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[torch.fx.Node]:
    """Set ``meta["val"]`` on every node that lacks it; return those nodes."""
    missing = [n for n in gm.graph.nodes if n.op != "output" and "val" not in n.meta]
    if not missing:
        return []
    mode = fake_mode_of(example_inputs)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in missing:
        if node.op == "placeholder":
            index = placeholders.index(node)
            if index >= len(example_inputs):
                raise MetaError(f"{describe(node)}: no example input for this placeholder")
            value = example_inputs[index]
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                value = mode.from_tensor(value)
            node.meta["val"] = value
            continue
        try:
            node.meta["val"] = _evaluate(gm, node, mode)
        except MetaError:
            raise
        except Exception as exc:
            raise MetaError(
                f"{describe(node)}: computing its output metadata failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return missing


def _signature(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return ("tensor", tuple(str(d) for d in val.shape), val.dtype, val.device.type)
    if isinstance(val, (list, tuple)):
        return tuple(_signature(v) for v in val)
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
        return type(val).__name__
    if isinstance(val, (int, float, bool)):
        return type(val).__name__
    return None


def check_meta(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Recompute every call's output metadata and compare it with ``meta["val"]``.

    Raises MetaError naming the first node whose recorded shape/dtype/device is missing or
    differs from what its inputs now produce.
    """
    mode = fake_mode_of(example_inputs)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if "val" not in node.meta:
            raise MetaError(f"{describe(node)} has no meta['val']")
        try:
            fresh = _evaluate(gm, node, mode)
        except Exception as exc:
            raise MetaError(
                f"{describe(node)} no longer runs on its inputs' metadata: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        old, new = _signature(node.meta["val"]), _signature(fresh)
        if old != new:
            raise MetaError(
                f"{describe(node)}: recorded output metadata {old} differs from what its "
                f"inputs produce now, {new}. A pass changed its inputs without updating "
                "meta['val'] (delete meta['val'] and airstream refills it)."
            )
