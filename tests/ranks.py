"""Gloo ranks for tests: ``run_ranks(world, fn, *args)`` spawns ``world`` processes on localhost,
each running ``fn(rank, world, *args)`` inside its own process group, and returns each rank's
result; a rank that raises fails the test with its error, and a hang fails after the timeout."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_ranks"]

TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...], out: Any
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        out.put((rank, fn(rank, world, *args), None))
    except BaseException as exc:  # reported to the test, which fails with it
        out.put((rank, None, repr(exc)))
    finally:
        dist.destroy_process_group()


def run_ranks(
    world: int, fn: Callable[..., Any], *args: Any, timeout_s: float = TIMEOUT_S
) -> dict[int, Any]:
    """Each rank's ``fn(rank, world, *args)`` (``fn`` importable by name: a module's function)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, fn, args, out)) for r in range(world)
    ]
    for p in procs:
        p.start()
    found: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, got, error = out.get(timeout=timeout_s)
            if error is not None:
                raise AssertionError(f"rank {rank} failed: {error}")
            found[rank] = got
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return found
