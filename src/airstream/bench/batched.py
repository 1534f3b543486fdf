"""``airstream bench batched-experts``: experts as one batched op, kept whole or split per expert.

When a model runs its experts as one grouped matmul (``bmm`` over stacked weights), a pass could
split it into one matmul per expert and spread those over streams. This measures whether that
pays on this machine: the batched block on one stream (torch's default threads and 1 thread)
against the same block split per expert over 2 streams (1 thread each). ``moe_experts`` leaves
batched experts alone; these figures are why.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from airstream.backend import get_backend
from airstream.bench.timing import checked_medians, with_threads
from airstream.ops.stream import stream

__all__ = ["BatchedExperts", "SplitExperts", "run_batched"]


class BatchedExperts(torch.nn.Module):
    """E experts as two bmm over stacked weights, outputs summed."""

    def __init__(self, experts: int, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(experts, hidden, 4 * hidden) / hidden**0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, 4 * hidden, hidden) / hidden**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = x.unsqueeze(0).expand(self.up.shape[0], *x.shape)
        return torch.bmm(torch.nn.functional.gelu(torch.bmm(xs, self.up)), self.down).sum(0)


class SplitExperts(torch.nn.Module):
    """The same weights, one mm pair per expert, odd experts on a side stream."""

    def __init__(self, batched: BatchedExperts) -> None:
        super().__init__()
        self.batched = batched

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, down = self.batched.up, self.batched.down
        outs = []
        for i in range(up.shape[0]):
            if i % 2:
                with stream("split_experts"):
                    outs.append(torch.nn.functional.gelu(x @ up[i]) @ down[i])
            else:
                outs.append(torch.nn.functional.gelu(x @ up[i]) @ down[i])
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total


def run_batched(
    experts: int = 8, tokens: int = 8, hidden: int = 1024, rounds: int = 15, calls: int = 5
) -> dict[str, Any]:
    """Time batched (1 stream) against split (2 streams); medians in ms."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    batched = BatchedExperts(experts, hidden).eval()
    split = SplitExperts(batched).eval()
    x = torch.randn(tokens, hidden)
    one = torch.compile(batched, backend=get_backend())
    two = torch.compile(split, backend=get_backend())

    candidates = {
        f"batched, 1 stream ({threads} threads)": with_threads(threads, lambda: one(x)),
        "batched, 1 stream (1 thread)": with_threads(1, lambda: one(x)),
        "split per expert, 2 streams": with_threads(threads, lambda: two(x)),
    }
    with torch.no_grad():
        want = batched(x)
    medians = checked_medians(candidates, want, rounds=rounds, calls_per_round=calls)
    return {
        "benchmark": "batched-experts",
        "experts": experts,
        "tokens": tokens,
        "hidden": hidden,
        "cores": os.cpu_count(),
        "ms": {k: v * 1e3 for k, v in medians.items()},
    }
