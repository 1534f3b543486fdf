"""Every rank of a graph's process groups deciding alike: a decision that differs between ranks
pairs different collectives and hangs. The groups are those the graph's own collectives name
(a pipeline stage's tensor-parallel group, not the default one); ranks in several overlapping
groups agree over all of them (as many rounds as groups, so a value crosses every overlap)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.fx

from airstream.graph.effects import effects
from airstream.graph.nodes import bound_arguments
from airstream.torch_internals import process_group, real_tensors

__all__ = ["collective_groups", "digest", "max_over_ranks", "same_on_every_rank"]


def collective_groups(graph: torch.fx.Graph) -> tuple[str, ...]:
    """The process groups (by name) the graph's collectives run on, sorted."""
    names = set()
    for node in graph.nodes:
        if effects(node).collective:
            name = bound_arguments(node).get("group_name")
            if name is not None:
                names.add(str(name))
    return tuple(sorted(names))


def _live(groups: Sequence[str]) -> list[Any]:
    """The groups that span more than this process (a fake group's collectives move nothing)."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    found = []
    for name in groups:
        group = process_group(name)
        if dist.get_world_size(group) > 1 and dist.get_backend(group) != "fake":
            found.append(group)
    return found


def max_over_ranks(values: torch.Tensor, groups: Sequence[str]) -> torch.Tensor:
    """``values`` (float64 or int64, on the CPU), each element the largest any rank of
    ``groups`` holds; every rank of them must call this at the same point."""
    live = _live(groups)
    out = values
    for _ in range(len(live)):
        for group in live:
            device = torch.device("cpu")
            if dist.get_backend(group) == "nccl":
                device = torch.device("cuda", torch.cuda.current_device())
            here = out.to(device)
            dist.all_reduce(here, op=dist.ReduceOp.MAX, group=group)
            out = here.cpu()
    return out


def digest(parts: Sequence[Any]) -> int:
    """A 62-bit number standing for ``parts`` (their text), the same on every rank."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 2


def same_on_every_rank(value: int, groups: Sequence[str]) -> bool:
    """Whether every rank of ``groups`` holds ``value`` (each compares the largest and the
    smallest held)."""
    with real_tensors():  # a pass runs inside AOTAutograd's fake mode
        found = max_over_ranks(torch.tensor([value, -value], dtype=torch.int64), groups)
        return int(found[0]) == -int(found[1])
