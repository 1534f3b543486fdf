"""Node metadata (``meta["val"]``) for nodes a pass added, and its re-check for ``verify_passes``.

Passes add nodes with ``graph.call_function`` and leave ``meta["val"]`` unset, or rewire a node's
arguments and leave its old value; stream analysis and later passes need it right.
:func:`fill_meta` evaluates the nodes that lack it, those the pass rewired and those downstream
whose inputs' layout changed, with the graph's own FakeTensorMode (so dynamic shapes keep their
symbols). :func:`check_meta` recomputes every node and
compares shape, dtype and device with what is recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from airstream.graph.nodes import describe
from airstream.torch_internals import FakeTensor, FakeTensorMode, detect_fake_mode

__all__ = ["MetaError", "check_meta", "fake_mode_of", "fill_meta", "node_inputs"]


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


def node_inputs(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, tuple[Any, Any, Any]]:
    """Each node's target and arguments, taken before a pass: :func:`fill_meta` recomputes the
    metadata of the nodes whose entry the pass changed."""
    return {n: (n.target, n.args, n.kwargs) for n in gm.graph.nodes}


def _layout(val: Any) -> Any:
    """What a later node's metadata depends on: shape, strides, dtype and device (sizes as text:
    comparing symbolic sizes would add guards)."""
    if isinstance(val, torch.Tensor):
        try:
            strides = tuple(str(s) for s in val.stride())
        except RuntimeError:  # a layout without strides (sparse)
            strides = ()
        return (tuple(str(d) for d in val.shape), strides, val.dtype, val.device)
    if isinstance(val, (list, tuple)):
        return tuple(_layout(v) for v in val)
    if isinstance(val, torch.SymInt | torch.SymFloat | torch.SymBool):
        return str(val)
    return val if isinstance(val, (int, float, bool, str)) or val is None else type(val)


def _as_layouts(args: Any) -> Any:
    """``args`` with each node in it replaced by the layout of its value."""
    return torch.fx.map_arg(args, lambda n: _layout(n.meta.get("val")))


def _rewired(node: torch.fx.Node, was: tuple[Any, Any, Any] | None) -> bool:
    """Whether a pass changed ``node``'s target, or its arguments to ones laid out otherwise,
    while its old ``meta["val"]`` stayed (FX replaces the argument tuples on every change, so
    identity tells which to compare; a node rewired to an equal value, as CSE and no-op removal
    do, keeps its metadata, as Inductor's FakeTensorUpdater keeps it)."""
    if was is None or "val" not in node.meta:
        return False
    target, args, kwargs = was
    if args is node.args and kwargs is node.kwargs:
        return target is not node.target
    if target is not node.target:
        return True
    try:
        old = _as_layouts((args, kwargs))
    except RuntimeError:  # an input the pass erased: its value is unknown now
        return True
    return old != _as_layouts((node.args, node.kwargs))


def fill_meta(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    before: dict[torch.fx.Node, tuple[Any, Any, Any]] | None = None,
) -> list[torch.fx.Node]:
    """Set ``meta["val"]`` on every node that lacks it; given ``before`` (:func:`node_inputs`
    taken before a pass), also recompute it where the pass rewired a node's arguments and, as
    Inductor's FakeTensorUpdater does, downstream of a node whose layout changed. A rewired node
    whose metadata cannot be recomputed keeps what the pass left. Returns the nodes set."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    stale: set[torch.fx.Node] = set()
    if before is not None:
        stale = {n for n in nodes if n.op != "placeholder" and _rewired(n, before.get(n))}
    if not stale and all("val" in n.meta for n in nodes):
        return []
    mode = fake_mode_of(example_inputs)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    changed: set[torch.fx.Node] = set()  # nodes whose layout the refill changed
    done: list[torch.fx.Node] = []
    for node in nodes:
        missing = "val" not in node.meta
        if node.op == "placeholder":
            if missing:
                node.meta["val"] = _example(node, placeholders.index(node), example_inputs, mode)
                done.append(node)
            continue
        if not (missing or node in stale or any(a in changed for a in node.all_input_nodes)):
            continue
        try:
            val = _evaluate(gm, node, mode)
        except MetaError:
            raise
        except Exception as exc:
            if not missing:  # the pass's own value stands
                continue
            raise MetaError(
                f"{describe(node)}: computing its output metadata failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not missing and _layout(val) != _layout(node.meta["val"]):
            changed.add(node)
        node.meta["val"] = val
        done.append(node)
    return done


def _example(
    node: torch.fx.Node, index: int, example_inputs: Sequence[Any], mode: FakeTensorMode
) -> Any:
    """A placeholder's value: its example input, as a fake tensor of ``mode``."""
    if index >= len(example_inputs):
        raise MetaError(f"{describe(node)}: no example input for this placeholder")
    value = example_inputs[index]
    if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
        value = mode.from_tensor(value)
    return value


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
