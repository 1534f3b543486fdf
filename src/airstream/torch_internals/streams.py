"""PyTorch's own stream IR, as Dynamo writes it (torch >= 2.11): the one place airstream reads it.

Dynamo traces ``with stream:`` (a ``torch.Stream``, ``torch.cuda.stream(s)``) as the node
annotation ``node.meta["custom"]["stream"] = i``, where ``i`` indexes Dynamo's registry of the
objects a graph uses (``torch._dynamo.graph_bytecode_inputs``: filled by the graph's bytecode
before every call, and at compile time with the objects seen while tracing). ``Event.record``,
``Event.wait``, ``Stream.wait_stream``, ``record_stream`` and the synchronizes become side-effect
ops in the ``streams`` namespace taking such indices; AOTAutograd (2.13 and later) wraps each in
the ``control_deps`` higher-order op. torch 2.11 leaves ``wait_stream``, ``Stream.wait_event``
and ``synchronize`` as method calls on the stream or event object, and has no synchronize ops.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from airstream.torch_internals.core import OperatorBase, OpOverloadPacket
from airstream.torch_internals.registry import _attr, _feature, _get, _module_reads

__all__ = [
    "STREAM_OPS",
    "ControlDeps",
    "control_deps_parts",
    "wrap_sync_nodes",
    "is_external_object",
    "mentions_torch_stream_ir",
    "torch_stream_method_call",
    "dynamo_stream_index",
    "torch_stream_op",
    "is_dynamo_stream_key",
    "rename_dynamo_stream_annotation",
    "set_dynamo_stream_index",
    "streams_op",
]

_STREAM_KEY = "stream"  # the node.meta["custom"] key Dynamo writes and Inductor reads
_REGISTRY = "torch._dynamo.graph_bytecode_inputs"
# every torch in range has these; the synchronize ops arrived in 2.13 (2.11: method calls)
_OPS = (
    "record_event",
    "wait_event",
    "wait_stream",
    "record_stream",
    "sync_dealloc",
    "fork",
    "join",
)
_LATER_OPS = ("synchronize_event", "synchronize_stream", "synchronize_device")
# every op name of torch's stream IR airstream reads, in any torch of the range
STREAM_OPS = _OPS + _LATER_OPS
# torch 2.11's method calls on a stream or event object, as the streams op each stands for
_METHODS = {"wait_stream", "wait_event", "synchronize", "record", "wait", "query"}


@dataclass(frozen=True)
class _TorchStreamIR:
    registry: Any  # the module holding Dynamo's registry of external objects
    ops: Mapping[Any, str]  # OpOverload -> its name in the streams namespace
    getter: Callable[[int], Any]  # get_external_object_by_index


@_feature(
    "native_streams",
    "torch._dynamo.graph_bytecode_inputs (index_to_external_object_weakref, "
    "index_to_bytecode_constructor, get_external_object_by_index), the torch.ops.streams ops "
    "registered by torch._dynamo.variables.streams, new_stream/new_event there, and "
    "node.meta['custom']['stream']",
    "torch-streams",
    "running torch.Stream / torch.Event / wait_stream in compiled model code on airstream's "
    "streams",
)
def _probe_torch_streams() -> _TorchStreamIR:
    registry = importlib.import_module(_REGISTRY)
    for name in ("index_to_external_object_weakref", "index_to_bytecode_constructor"):
        if not isinstance(getattr(registry, name), (dict, list)):
            raise TypeError(f"{_REGISTRY}.{name} is neither a dict nor a list")
    getter = _attr(f"{_REGISTRY}:get_external_object_by_index")
    variables = importlib.import_module("torch._dynamo.variables.streams")  # defines the ops
    for name in ("StreamVariable", "EventVariable"):
        getattr(variables, name)
    registry.register_graph_created_object  # noqa: B018  (new_torch_stream registers with it)
    namespace = torch.ops.streams
    ops = {getattr(namespace, name).default: name for name in _OPS}
    ops |= {getattr(namespace, n).default: n for n in _LATER_OPS if hasattr(namespace, n)}
    _module_reads("torch._dynamo.variables.streams", _STREAM_KEY)
    return _TorchStreamIR(registry, ops, getter)


def _ir() -> _TorchStreamIR:
    ir: _TorchStreamIR = _get("native_streams")
    return ir


def dynamo_stream_index(node: torch.fx.Node) -> int | None:
    """The registry index of the stream a node was traced under (``with stream:``), or None."""
    custom = node.meta.get("custom") or {}
    index = custom.get(_STREAM_KEY)
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def set_dynamo_stream_index(node: torch.fx.Node, index: int | None) -> None:
    """Annotate ``node`` as traced under the stream at registry ``index`` (None: remove it)."""
    custom = dict(node.meta.get("custom") or {})
    if index is None:
        custom.pop(_STREAM_KEY, None)
    else:
        custom[_STREAM_KEY] = index
    if custom:
        node.meta["custom"] = custom
    else:
        node.meta.pop("custom", None)


def is_dynamo_stream_key(key: str) -> bool:
    """True for the ``node.meta["custom"]`` key Dynamo writes a stream block's index under."""
    return key == _STREAM_KEY


def rename_dynamo_stream_annotation(node: torch.fx.Node, key: str) -> bool:
    """Move Dynamo's stream index to airstream's annotation ``key``, at the same place in the
    annotation dict (its order says which of two nested blocks is inner). AOTAutograd acts on
    Dynamo's key (its backward stream syncs, which fail on CPU builds), never on airstream's.
    Returns whether the node had one."""
    custom = node.meta.get("custom")
    if not custom or _STREAM_KEY not in custom:
        return False
    node.meta["custom"] = {(key if k == _STREAM_KEY else k): v for k, v in custom.items()}
    return True


def streams_op(name: str) -> Any:
    """The ``torch.ops.streams.<name>`` overload (for passes that write native form)."""
    for op, op_name in _ir().ops.items():
        if op_name == name:
            return op
    raise LookupError(f"torch {torch.__version__} has no torch.ops.streams.{name}")


def torch_stream_op(target: Any) -> str | None:
    """The name of the ``torch.ops.streams`` op ``target`` is (``"record_event"``, ...), or None.
    Cheap for any target: other namespaces are rejected before the registry is consulted."""
    if not isinstance(target, (OperatorBase, OpOverloadPacket)):
        return None
    overload = getattr(target, "default", target)  # Dynamo's graph calls the packet
    if getattr(overload, "namespace", None) != "streams":
        return None
    return _ir().ops.get(overload)


def _is_hop(target: Any, name: str) -> bool:
    hop_name = getattr(target, "name", None)
    return isinstance(target, OperatorBase) and callable(hop_name) and hop_name() == name


@dataclass(frozen=True)
class ControlDeps:
    """A ``control_deps`` node taken apart: the side-effect op it wraps (``target``) with its
    arguments as values of the outer graph, and which outer value each ``getitem`` index of the
    wrapper returns (index 0 is the op's own result: None)."""

    target: Any
    args: tuple[Any, ...]
    returned: Mapping[int, Any]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def control_deps_parts(gm: torch.fx.GraphModule, node: torch.fx.Node) -> ControlDeps | None:
    """AOTAutograd's wrapper of one side-effect op, taken apart; None for any other node.

    The wrapper is ``control_deps(deps, subgraph, *passthrough)``: the subgraph takes the
    passthrough values as placeholders, calls the op and returns ``(op result, *passthrough)``,
    so that the values read after it are ordered after the op."""
    if node.op != "call_function" or not _is_hop(node.target, "control_deps"):
        return None
    sub_node = node.args[1] if len(node.args) > 1 else None
    if not isinstance(sub_node, torch.fx.Node) or sub_node.op != "get_attr":
        return None
    sub = getattr(gm, str(sub_node.target), None)
    if not isinstance(sub, torch.fx.GraphModule):
        return None
    calls = [n for n in sub.graph.nodes if n.op == "call_function"]
    if len(calls) != 1:
        return None
    passthrough = list(node.args[2:])
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    outer = {p: passthrough[i] for i, p in enumerate(placeholders) if i < len(passthrough)}

    def to_outer(value: Any) -> Any:
        return outer.get(value) if isinstance(value, torch.fx.Node) else value

    output = next(n for n in sub.graph.nodes if n.op == "output")
    results = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    returned = {i: None if r is calls[0] else to_outer(r) for i, r in enumerate(results)}
    kwargs = {k: to_outer(v) for k, v in calls[0].kwargs.items()}
    return ControlDeps(calls[0].target, tuple(to_outer(a) for a in calls[0].args), returned, kwargs)


def mentions_torch_stream_ir(node: torch.fx.Node) -> bool:
    """Cheap, for any node: does it belong to PyTorch's stream IR (a stream annotation, a
    ``streams`` op, a ``control_deps`` wrapper, a registry object, a 2.11 stream method call)?
    No registry access for the nodes of a plain graph."""
    if dynamo_stream_index(node) is not None:
        return True
    if node.op == "call_method":
        return node.target in ("wait_stream", "wait_event")
    if node.op != "call_function":
        return False
    target = node.target
    if isinstance(target, (OperatorBase, OpOverloadPacket)):
        overload = getattr(target, "default", target)
        return getattr(overload, "namespace", None) == "streams" or _is_hop(target, "control_deps")
    return getattr(target, "__name__", None) == "get_external_object_by_index" and (
        getattr(target, "__module__", None) == _REGISTRY
    )


def is_external_object(node: torch.fx.Node) -> bool:
    """True for Dynamo's ``get_external_object_by_index(i)`` node (the stream or event at ``i``)."""
    return node.op == "call_function" and node.target is _ir().getter


def torch_stream_method_call(node: torch.fx.Node) -> tuple[str, list[int]] | None:
    """torch 2.11's form: a method call (``wait_stream``, ``wait_event``, ``synchronize``,
    ``record``, ``wait``) on stream or event objects, as ``(method, [registry index of each
    object argument])``; None for any other node."""
    if node.op != "call_method" or node.target not in _METHODS:
        return None
    indices = []
    for arg in node.args:
        if not isinstance(arg, torch.fx.Node) or not is_external_object(arg):
            return None
        indices.append(int(arg.args[0]))  # type: ignore[arg-type]
    return str(node.target), indices


def wrap_sync_nodes(gm: torch.fx.GraphModule) -> bool:
    """Wrap each ``torch.ops.streams`` op of ``gm`` in ``control_deps``, as AOTAutograd does, so
    that Inductor keeps each one between the nodes around it; False where this torch has no
    such wrapping (2.11, whose Inductor takes the ops bare)."""
    try:
        module = importlib.import_module("torch._functorch._aot_autograd.streams")
    except ImportError:
        return False
    wrap = getattr(module, "wrap_all_sync_nodes_with_control_deps", None)
    if wrap is None:
        return False
    wrap(gm)
    return True
