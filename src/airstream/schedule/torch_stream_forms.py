"""PyTorch's stream IR as each torch release writes it, read as one list of ops: the one reader
of its forms.

Dynamo (and passes) write an event call or a stream sync as a bare ``torch.ops.streams`` op,
AOTAutograd wraps each in ``control_deps`` (torch 2.13 and later), and torch 2.11 leaves some as
method calls on the stream or event object. :func:`collect_torch_stream_ops` turns a graph's forms
into :class:`TorchStreamOp` records in program order, named as the newest torch names them
(unwrapping ``control_deps`` around any other op, telling torch 2.11's ``synchronize`` of a stream
from an event's); ``schedule/torch_streams.py`` gives them their meaning, one handler per op name.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.ops.torch_streams import TorchStreams

__all__ = [
    "TorchStreamOp",
    "collect_torch_stream_ops",
    "drop_dead_objects",
    "erase_wrapper",
    "replace_results",
]


@dataclass
class TorchStreamOp:
    """One op of torch's stream IR in program order: the node standing for it, its name in the
    ``torch.ops.streams`` namespace (one of ``torch_internals.STREAM_OPS``) and its arguments;
    or, where ``supported`` is False, a method no streams op stands for (``name``: the method)."""

    anchor: torch.fx.Node
    name: str
    args: tuple[Any, ...]
    returned: dict[int, Any] | None = None  # a control_deps wrapper's getitem results
    supported: bool = True


def collect_torch_stream_ops(gm: torch.fx.GraphModule, table: TorchStreams) -> list[TorchStreamOp]:
    """Every op of torch's stream IR in ``gm``, in program order, as the streams ops of the newest
    torch, whatever form the torch release wrote (``table``: the graph's streams and events)."""
    found: list[TorchStreamOp] = []
    for node in list(gm.graph.nodes):
        if node.op == "call_function":
            name = torch_internals.torch_stream_op(node.target)
            if name is not None:
                found.append(TorchStreamOp(node, name, tuple(node.args)))
                continue
            parts = torch_internals.control_deps_parts(gm, node)
            if parts is not None:
                inner = torch_internals.torch_stream_op(parts.target)
                if inner is None:
                    _unwrap(gm, node, parts)  # another side-effect op: call it in place
                else:
                    found.append(TorchStreamOp(node, inner, parts.args, dict(parts.returned)))
        elif node.op == "call_method":
            call = torch_internals.torch_stream_method_call(node)
            if call is not None:
                found.append(_method_op(node, table, *call))
    return found


def _method_op(
    node: torch.fx.Node, table: TorchStreams, method: str, objects: list[int]
) -> TorchStreamOp:
    """torch 2.11's method calls as the ops later releases write."""
    if method == "wait_stream" and len(objects) == 2:
        return TorchStreamOp(node, "wait_stream", (objects[0], objects[1]))
    if method == "wait_event" and len(objects) == 2:
        return TorchStreamOp(node, "wait_event", (objects[1], objects[0]))
    stream = objects[1] if len(objects) > 1 else None  # Event.record/wait(stream=None)
    if method == "synchronize" and len(objects) == 1:  # a stream's or an event's
        name = "synchronize_stream" if table.is_stream(objects[0]) else "synchronize_event"
        return TorchStreamOp(node, name, (objects[0],))
    if method == "record" and objects:
        return TorchStreamOp(node, "record_event", (objects[0], stream))
    if method == "wait" and objects:
        return TorchStreamOp(node, "wait_event", (objects[0], stream))
    return TorchStreamOp(node, method, tuple(objects), supported=False)


def _unwrap(gm: torch.fx.GraphModule, node: torch.fx.Node, parts: Any) -> None:
    """Replace a ``control_deps`` wrapper by a direct call of the op it wraps."""
    graph = gm.graph
    with graph.inserting_before(node):
        call = graph.call_function(parts.target, tuple(parts.args))
    call.kwargs = dict(parts.kwargs)
    call.meta.update(node.meta)
    replace_results(node, parts.returned, call)
    erase_wrapper(gm, node)


def replace_results(node: torch.fx.Node, returned: dict[int, Any], result: Any) -> None:
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            index = user.args[1]
            value = result if index == 0 else returned.get(index)  # type: ignore[arg-type]
            if isinstance(value, torch.fx.Node):
                user.replace_all_uses_with(value)
            user.graph.erase_node(user)


def erase_wrapper(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    sub = node.args[1] if len(node.args) > 1 else None
    for user in list(node.users):  # a later wrapper lists this one among what it comes after
        if user.op == "call_function" and user.args and isinstance(user.args[0], tuple):
            user.args = (tuple(d for d in user.args[0] if d is not node), *user.args[1:])
    node.graph.erase_node(node)
    if isinstance(sub, torch.fx.Node) and sub.op == "get_attr" and not sub.users:
        target = str(sub.target)
        node.graph.erase_node(sub)
        if hasattr(gm, target):
            delattr(gm, target)


def drop_dead_objects(gm: torch.fx.GraphModule) -> None:
    for node in reversed(list(gm.graph.nodes)):
        if not node.users and torch_internals.is_external_object(node):
            gm.graph.erase_node(node)
