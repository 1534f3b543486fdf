"""The reference executor: the optimized graph on one thread, in graph order.

Graph order is a valid order for every rule of the stream semantics (data edges, record/wait,
wait_tensor, mutation order, RNG order), so running it serially is correct by construction; it
backs ``debug.run_eagerly`` and is the oracle the parallel runtimes are tested against.

It runs FX-generated Python code, not an ``fx.Interpreter``: the air ops are stripped before code
generation (scope markers and waits vanish, ``wait_tensor(a, b)`` becomes ``a``, a record token
nobody reads is dropped), so per-op cost is exactly that of an ``fx.GraphModule``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from airstream.ops.library import record, scope_enter, scope_exit, wait, wait_tensor

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


class SerialExecutor:
    """Boxed callable (AOTAutograd convention: takes the argument list) running one graph."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        # An instance attribute, so wrappers made with functools.wraps (AOTAutograd wraps the
        # backward compiler's result) copy it and keep calling us boxed.
        self._boxed_call = True
        self.module = strip_air_ops(gm)
        self._forward = self.module.forward

    @property
    def code(self) -> str:
        """The generated Python code that runs."""
        return self.module.code

    def __call__(self, args: list[Any]) -> Any:
        return self._forward(*args)
