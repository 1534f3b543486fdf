"""Benchmark models: ``moe-shared`` (router + dense top-k + shared expert), ``branches``
(4 independent branches of different cost, Inception-like) and ``mlp`` (purely sequential)."""

from __future__ import annotations

import torch

from airstream.bench.moe import Expert

__all__ = ["Branches", "Mlp", "MoEShared"]


class MoEShared(torch.nn.Module):
    """Router -> softmax -> top-k weights applied densely to every expert, plus a shared expert."""

    def __init__(self, experts: int = 8, hidden: int = 1024, top_k: int = 2) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(Expert(hidden) for _ in range(experts))
        self.shared_expert = Expert(hidden)
        self.top_k = top_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x), dim=-1)
        top, index = torch.topk(probs, self.top_k, dim=-1)
        weights = torch.zeros_like(probs).scatter(-1, index, top)
        routed = weights[:, 0:1] * self.experts[0](x)
        for i in range(1, len(self.experts)):
            routed = routed + weights[:, i : i + 1] * self.experts[i](x)
        return routed + self.shared_expert(x)


class Branches(torch.nn.Module):
    """4 branches on the same input with 1, 2, 3 and 4 Linear+GELU layers, summed at the end."""

    def __init__(self, hidden: int = 1024) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList(
            torch.nn.Sequential(
                *[
                    m
                    for _ in range(depth)
                    for m in (torch.nn.Linear(hidden, hidden), torch.nn.GELU())
                ]
            )
            for depth in (1, 2, 3, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]
        return outs[0] + outs[1] + outs[2] + outs[3]


class Mlp(torch.nn.Module):
    """6 Linear+GELU layers in a row: nothing can run concurrently."""

    def __init__(self, hidden: int = 1024, depth: int = 6) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            *[m for _ in range(depth) for m in (torch.nn.Linear(hidden, hidden), torch.nn.GELU())]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
