"""The reference models of ``passes.microbatch_overlap()`` (``airstream bench microbatch`` and
its tests): an expert-parallel MoE layer with a shared expert, beside the tensor-parallel MLP
stack of :mod:`airstream.bench.tp`, each with a hand-written Domino-style split (the same two
micro-batches, ``async_op=True`` collectives waited one stage late) to compare the pass with.

:class:`EPMoE`: ``experts`` experts, ``experts / world`` of them on each rank. Dispatch sends
every token to every rank (``all_to_all_single`` with equal splits, each ``T``); each rank routes
what it received (top-k of a replicated router), sorts the rows by expert, runs its own experts
on their rows, adds each row's weighted result back at its token (``index_add``); the combine
sends the results home (a second ``all_to_all_single``) and sums them over the ranks; a shared
expert runs on the local tokens beside. The collectives' split sizes follow the token count, so a
micro-batch's are its own. The collectives are functional ones in autograd functions (the
backward's all-to-alls run the other way), so Dynamo captures them and training works.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from airstream.torch_internals import functional_collectives

__all__ = ["EPMoE", "ep_moe_reference", "moe_weights"]

funcol = functional_collectives()


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all of rank blocks forward; the same exchange backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, world: int) -> torch.Tensor:
        ctx.world = world
        splits = [x.shape[0] // world] * world
        return funcol.all_to_all_single(x, splits, splits, dist.group.WORLD)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        splits = [grad.shape[0] // ctx.world] * ctx.world
        return funcol.all_to_all_single(grad.contiguous(), splits, splits, dist.group.WORLD), None


def moe_weights(hidden: int, ffn: int, experts: int) -> dict[str, torch.Tensor]:
    """The full weights, the same on every rank."""
    gen = torch.Generator().manual_seed(7)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    return {
        "router": rand(experts, hidden, scale=hidden**-0.5),
        "w1": rand(experts, hidden, ffn, scale=hidden**-0.5),
        "w2": rand(experts, ffn, hidden, scale=ffn**-0.5),
        "s1": rand(hidden, ffn, scale=hidden**-0.5),
        "s2": rand(ffn, hidden, scale=ffn**-0.5),
    }


class EPMoE(torch.nn.Module):
    """One expert-parallel MoE layer with a shared expert: this rank's shard."""

    def __init__(
        self,
        hidden: int,
        ffn: int,
        experts: int,
        top_k: int,
        rank: int,
        world: int,
        comm: bool = True,
    ) -> None:
        super().__init__()
        self.comm = comm  # False: the compute alone (the all-to-alls left out)
        if experts % world:
            raise ValueError(f"{experts} experts do not divide among {world} ranks")
        full = moe_weights(hidden, ffn, experts)
        local = slice(rank * experts // world, (rank + 1) * experts // world)
        self.router = torch.nn.Parameter(full["router"])
        self.w1 = torch.nn.Parameter(full["w1"][local].clone())
        self.w2 = torch.nn.Parameter(full["w2"][local].clone())
        self.s1 = torch.nn.Parameter(full["s1"])
        self.s2 = torch.nn.Parameter(full["s2"])
        self.first, self.top_k, self.world = local.start, top_k, world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, hidden = x.shape
        world, k = self.world, self.top_k
        send = x.unsqueeze(0).expand(world, tokens, hidden).reshape(world * tokens, hidden)
        recv = _AllToAll.apply(send, world) if self.comm else send  # every rank's, in turn
        weights, ids = torch.topk(torch.softmax(recv @ self.router.t(), dim=-1), k, dim=-1)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the rows sorted by expert
        rows = order // k  # each sorted entry's row of recv
        picked, expert = recv[rows], flat[order]
        gate = weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(picked)
        for e in range(self.w1.shape[0]):
            mine = (expert == self.first + e).unsqueeze(-1).to(x.dtype)
            out = out + torch.nn.functional.gelu(picked @ self.w1[e]) @ self.w2[e] * mine
        combined = torch.zeros_like(recv).index_add(0, rows, out * gate)
        back = _AllToAll.apply(combined, world) if self.comm else combined  # mine, by rank
        shared = torch.nn.functional.gelu(x @ self.s1) @ self.s2
        return back.reshape(world, tokens, hidden).sum(0) + shared


def ep_moe_reference(x: torch.Tensor, hidden: int, ffn: int, experts: int, top_k: int) -> Any:
    """What :class:`EPMoE` computes for one rank's tokens ``x``, in one process: every expert
    applied to the tokens routed to it, plus the shared expert (``world`` ranks each send the
    same tokens to every rank, so their sums over ranks equal this)."""
    full = moe_weights(hidden, ffn, experts)
    weights, ids = torch.topk(torch.softmax(x @ full["router"].t(), dim=-1), top_k, dim=-1)
    out = torch.zeros_like(x)
    for e in range(experts):
        gate = (weights * (ids == e)).sum(-1, keepdim=True)
        out = out + torch.nn.functional.gelu(x @ full["w1"][e]) @ full["w2"][e] * gate
    return out + torch.nn.functional.gelu(x @ full["s1"]) @ full["s2"]
