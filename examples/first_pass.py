"""Your first pass: put one branch of a parallel block on a side stream.

    python examples/first_pass.py

The block's normalized input feeds two branches, each Linear -> activation -> Linear, and their
outputs are summed with the residual: the shape of GPT-J's and PaLM's parallel blocks (there one
branch is attention). The pass finds the ``right`` branch by its module path and runs it on
stream ``side``, so it can run while the main stream computes ``left``. The pass runs on every
graph of a compile: once for inference, and on the forward and the backward graph of a training
step. The script prints what the pass sees, which nodes each graph runs on ``side``, and checks
outputs and gradients against eager PyTorch. Small sizes: a few seconds on a CPU.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

import airstream
from airstream import passes


class ParallelBlock(torch.nn.Module):
    """x + left(norm(x)) + right(norm(x))."""

    def __init__(self, dim: int = 64, hidden: int = 256) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.left = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, dim)
        )
        self.right = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden), torch.nn.SiLU(), torch.nn.Linear(hidden, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.left(h) + self.right(h)


SHOW = True  # print the graphs the pass receives


def right_on_side_stream(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    """Run every op of the ``right`` branch on stream ``side``."""
    kind = passes.graph_kind(gm)  # "inference", "forward" or "backward"
    # Module paths come from nn_module_stack; in a backward graph, from the forward node's
    # (fwd_nn_module_stack): the gradient ops of `right` match too.
    chosen = passes.select_nodes(gm, module=r"^right\b")
    if SHOW:
        print(f"--- {kind} graph: {len(chosen)} ops go to 'side'")
        ops = [n for n in gm.graph.nodes if n.op == "call_function"]
        width = max(len(n.name) for n in ops)
        for node in ops:
            target = str(node.target)  # aten.addmm.default
            if target.startswith("<"):
                target = node.target.__name__  # operator.getitem
            path = (passes.module_paths(node) or ["-"])[-1]  # the innermost module
            mark = "-> side" if node in chosen else ""
            print(f"  {node.name:<{width}}  {target:<32} {path:<8} {mark}".rstrip())
    passes.place_on_stream(gm, chosen, "side")


@dataclass
class Run:
    """What main() made: the backend (its .graphs), the eager model and its compiled twin."""

    backend: airstream.backend.AirstreamBackend
    model: torch.nn.Module
    compiled: Any


def main(show: bool = True) -> Run:
    global SHOW
    SHOW = show
    torch.manual_seed(0)
    model = ParallelBlock()
    x = torch.randn(2, 8, 64)  # batch 2, 8 tokens, width 64

    config = airstream.CompilerConfig()
    config.mode = "reduce-overhead"  # aten calls: every node stays visible (see below)
    config.post_grad_custom_pre_pass = right_on_side_stream
    backend = airstream.get_backend(compiler_config=config)
    compiled = torch.compile(model, backend=backend)

    # Inference: one graph.
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))

    # A training step: a forward and a backward graph.
    reference = copy.deepcopy(model)
    compiled(x).pow(2).mean().backward()
    reference(x).pow(2).mean().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, name=name: f"{name}: {m}")

    if show:
        print("--- what runs on 'side'")
        for graph in backend.graphs:
            print(f"  {graph.kind:<10} {', '.join(graph.streams.nodes_on('side'))}")
        print("outputs and gradients match eager")
    return Run(backend, model, compiled)


if __name__ == "__main__":
    main()
