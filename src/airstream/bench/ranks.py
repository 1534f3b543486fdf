"""Ranks in spawned processes, for the distributed benchmarks and the tests.

:func:`run_ranks` starts ``world`` processes on localhost, each in a gloo process group with one
intra-op thread, runs ``fn(rank, world, *args)`` in each and returns every rank's result.
:func:`run_in_child` runs ``fn(*args)`` in one spawned process that makes its own group (a
modelled one). A rank that raises fails the whole run with its error; one that does not answer
within ``timeout_s`` is killed, and one that dies without answering fails it at once. ``fn`` must be
importable by name (a module's function, or a ``functools.partial`` of one).
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_in_child", "run_ranks"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answer(rank: int, fn: Callable[..., Any], args: tuple[Any, ...], out: Any) -> None:
    try:
        out.put((rank, fn(*args), None))
    except BaseException as exc:  # reported by the parent, which raises it
        out.put((rank, None, "".join(traceback.format_exception(exc))[-3000:]))


def _gloo_rank(
    rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple[Any, ...], out: Any
) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    except BaseException as exc:  # the port taken meanwhile, say: reported, not a silent death
        out.put((rank, None, "".join(traceback.format_exception(exc))[-3000:]))
        return
    try:
        _answer(rank, fn, (rank, world, *args), out)
    finally:
        dist.destroy_process_group()


def _child(fn: Callable[..., Any], args: tuple[Any, ...], out: Any) -> None:
    torch.set_num_threads(1)
    _answer(0, fn, args, out)


def _collect(procs: list[Any], out: Any, timeout_s: float, what: str) -> dict[int, Any]:
    for p in procs:
        p.start()
    found: dict[int, Any] = {}
    errors: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < len(procs):
            try:
                rank, got, error = out.get(timeout=1.0)
            except queue.Empty:
                silent = [r for r, p in enumerate(procs) if r not in found and not p.is_alive()]
                if silent:  # dead without answering (a crash, or a kill): its answer never comes
                    codes = ", ".join(f"rank {r}: exit code {procs[r].exitcode}" for r in silent)
                    raise RuntimeError(f"{what}: ended without an answer ({codes})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what}: no answer within {timeout_s:.0f} s") from None
                continue
            if error is not None:
                errors[rank] = error
                break  # the others may wait on it forever: they are stopped below
            found[rank] = got
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    if errors:
        said = "\n".join(f"rank {r}:\n{e}" for r, e in sorted(errors.items()))
        raise RuntimeError(f"{what}: rank(s) {sorted(errors)} failed:\n{said}")
    return found


def run_ranks(
    world: int, fn: Callable[..., Any], *args: Any, timeout_s: float = 900.0, what: str = "ranks"
) -> dict[int, Any]:
    """Each rank's ``fn(rank, world, *args)``, by rank (``what`` names the run in errors)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_gloo_rank, args=(r, world, port, fn, args, out)) for r in range(world)
    ]
    return _collect(procs, out, timeout_s, what)


def run_in_child(
    fn: Callable[..., Any], *args: Any, timeout_s: float = 900.0, what: str = "child"
) -> Any:
    """``fn(*args)`` in one spawned process with one intra-op thread."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    return _collect([ctx.Process(target=_child, args=(fn, args, out))], out, timeout_s, what)[0]
