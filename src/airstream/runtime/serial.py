"""The reference executor: the optimized graph on one thread, in graph order.

Graph order is a valid order for every rule of the stream semantics (data edges, record/wait,
wait_tensor, mutation order, RNG order), so running it serially is correct by construction; it
backs ``debug.run_eagerly`` and is the oracle the parallel runtimes are tested against.

It runs FX-generated Python code, not an ``fx.Interpreter``: the air ops are stripped before code
generation (scope markers and waits vanish, ``wait_tensor(a, b)`` becomes ``a``, a record token
nobody reads is dropped), so per-op cost is exactly that of an ``fx.GraphModule``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
import torch.fx

from airstream.ops.library import record, scope_enter, scope_exit, wait, wait_tensor
from airstream.runtime.codegen import emit_op
from airstream.runtime.trace import CallTrace, tracing_wanted
from airstream.schedule.streams import StreamAssignment

__all__ = ["SerialExecutor", "strip_air_ops"]


def strip_air_ops(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new GraphModule computing the same values as ``gm`` without air ops."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is wait_tensor:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        elif node.target in (scope_enter, scope_exit, wait):
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is record and not node.users:
            graph.erase_node(node)
    return torch.fx.GraphModule(gm, graph, class_name="AirstreamSerial")


def _traced(module: torch.fx.GraphModule, stream_of: Mapping[str, str | None]) -> Any:
    """A copy of ``module`` taking a dict of StreamTraces first, each op bracketed by tracing."""
    graph = torch.fx.Graph()
    traces = graph.placeholder("traces")
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in module.graph.nodes:
        if node.op == "placeholder":
            env[node] = graph.node_copy(node, env.__getitem__)
        elif node.op == "call_function":
            label = stream_of.get(node.name)
            trace = graph.call_function(operator.getitem, (traces, label))
            env[node] = emit_op(graph, node, env.__getitem__, trace)
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
    return torch.fx.GraphModule(module, graph, class_name="AirstreamSerialTraced").forward


class SerialExecutor:
    """Boxed callable (AOTAutograd convention: takes the argument list) running one graph."""

    def __init__(self, gm: torch.fx.GraphModule, streams: StreamAssignment | None = None) -> None:
        # An instance attribute, so wrappers made with functools.wraps (AOTAutograd wraps the
        # backward compiler's result) copy it and keep calling us boxed.
        self._boxed_call = True
        self.module = strip_air_ops(gm)
        self._forward = self.module.forward
        self._stream_of = dict(streams.stream_of) if streams is not None else {}
        self._labels = tuple(streams.streams) if streams is not None else (None,)
        self._forward_traced = _traced(self.module, self._stream_of)

    @property
    def code(self) -> str:
        """The generated Python code that runs."""
        return self.module.code

    def __call__(self, args: list[Any]) -> Any:
        if not tracing_wanted():
            return self._forward(*args)
        trace = CallTrace()
        try:
            return self._forward_traced(
                {label: trace.stream(label) for label in self._labels}, *args
            )
        finally:
            trace.finish()
