"""Small read-only helpers about FX nodes, shared by passes, analysis and error messages."""

from __future__ import annotations

import math
import operator
import os
import re
from typing import Any

import torch
import torch.fx
import torch.nn.functional

from airstream.graph.fused import CompiledSegment
from airstream.torch_internals import OpOverload, OpOverloadPacket, op_name, op_schema, stack_trace

__all__ = [
    "GRAPH_KINDS",
    "GRAPH_KIND_KEY",
    "MADE_AFTER_KEY",
    "MEASUREMENT_KEY",
    "AUTO_STREAMS_KEY",
    "CANDIDATES_KEY",
    "NAMES_KEY",
    "INSERTED_BY_KEY",
    "SEGMENT_KEY",
    "graph_kind",
    "segment_of",
    "bound_arguments",
    "describe",
    "source_line",
    "target_name",
    "torch_function_name",
]


SEGMENT_KEY = "air_segment"  # node.meta key of a fused max-autotune node: its CompiledSegment
INSERTED_BY_KEY = "air_inserted_by"  # node.meta key: the pass that added the node (its name)
# node.meta key of a view made after a max-autotune segment from what it returns (its name)
MADE_AFTER_KEY = "air_made_after"
GRAPH_KIND_KEY = "air_graph_kind"  # gm.meta key: which graph of a compile this is
MEASUREMENT_KEY = "air_measurement"  # gm.meta key: what measure_placement measured (Measurements)
AUTO_STREAMS_KEY = "airstream_auto_streams"  # gm.meta key: auto_streams' decision
# auto_streams' alternative placements (passes/auto/candidates.py): node.meta, candidate name ->
# stream label (no entry: main); gm.meta, the candidates' names in predicted order
CANDIDATES_KEY = "air_auto_candidates"
NAMES_KEY = "air_auto_candidate_names"
GRAPH_KINDS = ("inference", "forward", "backward")


def graph_kind(gm: torch.fx.GraphModule) -> str:
    """Which graph of a compile ``gm`` is: ``"inference"`` (no gradients needed), or a training
    step's ``"forward"`` or ``"backward"``; every pass runs on each graph of the compile.

    The backend stamps the kind before the passes run; a graph it never saw is a backward graph
    when it takes ``tangents`` inputs, else a forward graph."""
    stamped = gm.meta.get(GRAPH_KIND_KEY)
    if stamped in GRAPH_KINDS:
        return str(stamped)
    for node in gm.graph.find_nodes(op="placeholder"):
        if node.name.startswith("tangents"):
            return "backward"
    return "forward"


def segment_of(node: torch.fx.Node) -> CompiledSegment | None:
    """The CompiledSegment a fused max-autotune node runs, or None for any other node."""
    return node.meta.get(SEGMENT_KEY)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME = re.compile(
    r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n(?P<code>[^\n]*)'
)


# Where Dynamo's call targets live, under the names people write them with.
_TORCH_HOMES: tuple[tuple[str, Any], ...] = (
    ("torch", torch),
    ("torch.nn.functional", torch.nn.functional),
    ("torch.linalg", torch.linalg),
    ("torch.fft", torch.fft),
    ("torch.special", torch.special),
    ("torch.Tensor", torch.Tensor),
    ("operator", operator),
    ("math", math),
)


def torch_function_name(target: Any) -> str | None:
    """``torch.mm``-style name of a torch (or operator/math) function, or None."""
    name = getattr(target, "__name__", None)
    if not isinstance(name, str):
        return None
    for home, module in _TORCH_HOMES:
        if getattr(module, name, None) is target:
            return f"{home}.{name}"
    module_name = getattr(target, "__module__", None)
    if isinstance(module_name, str) and not any(p.startswith("_") for p in module_name.split(".")):
        return f"{module_name}.{getattr(target, '__qualname__', name)}"
    return None


def target_name(node: torch.fx.Node) -> str:
    """``aten.mm.default``-style name of a node's target: ``Tensor.relu`` for a Dynamo graph's
    method call, ``streams.wait_stream`` for an op packet, the op for other non-calls."""
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op != "call_function":
        return node.op
    target = node.target
    if isinstance(target, OpOverload):
        return ".".join(op_name(target))
    if isinstance(target, OpOverloadPacket):
        return str(target)  # the Dynamo graph calls packets: "streams.wait_stream"
    if SEGMENT_KEY in node.meta:  # max-autotune: an Inductor-compiled segment
        return "inductor_segment"
    known = torch_function_name(target)  # the Dynamo graph's torch.mm, operator.add, ...
    if known is not None:
        return known
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return str(name) if name is not None else repr(target)


def source_line(node: torch.fx.Node) -> str | None:
    """``file.py:12 `code``` for the user source line a node was traced from, if known."""
    trace = stack_trace(node)
    if not trace:
        return None
    frames = list(_FRAME.finditer(trace))
    if not frames:
        return None
    # the caller's line, not torch's own (a functional collective's frame in torch.distributed)
    own = [f for f in frames if not f.group("file").startswith(_TORCH_DIR)]
    last = (own or frames)[-1]
    code = last.group("code").strip()
    if code.startswith('File "'):  # a frame with no source line (``<stdin>``): the next one's
        code = ""
    where = f"{last.group('file')}:{last.group('line')}"
    return f"{where} `{code}`" if code else where


def describe(node: torch.fx.Node) -> str:
    """One-line description for messages: name, target, and source line or inserting pass."""
    text = f"node {node.name!r} ({target_name(node)})"
    line = source_line(node)
    if line:
        return f"{text} at {line}"
    inserted_by = node.meta.get(INSERTED_BY_KEY)
    if inserted_by:
        return f"{text}, inserted by pass {inserted_by!r} (no source line)"
    return f"{text} (no source line recorded)"


def bound_arguments(node: torch.fx.Node) -> dict[str, Any]:
    """A call of an op overload's arguments by their schema's names, defaults filled in
    (``{"self": x, "dim": [-1], "keepdim": False, ...}``); empty for any other node."""
    schema = op_schema(node.target) if node.op == "call_function" else None
    if schema is None:
        return {}
    bound: dict[str, Any] = {}
    for index, argument in enumerate(schema.arguments):
        if index < len(node.args) and not argument.kwarg_only:
            bound[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            bound[argument.name] = node.kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
        else:
            bound[argument.name] = None
    return bound
