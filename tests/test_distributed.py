"""Functional collectives in compiled graphs, 2 ranks over gloo on localhost.

Each test spawns 2 processes (bounded: a hung rank fails the test), compiles the same model with
airstream on both, and compares with a single-process reference. Marked ``distributed`` so that
``-m "not distributed"`` deselects them.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.distributed

WORLD = 2
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)


def _input(rank: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(100 + rank))


def _model(w1: torch.Tensor, w2: torch.Tensor) -> Any:
    import torch.distributed._functional_collectives as funcol

    import airstream

    def model(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("comm"):  # the first collective on a side stream...
            a = funcol.all_reduce(x @ w1, "sum", dist.group.WORLD)
        b = (x @ w2).relu()
        c = funcol.all_reduce(b, "sum", dist.group.WORLD)  # ...the second on main
        return a * 2 + c

    return model


def _worker(rank: int, port: int, mode: str, results: Any) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        import airstream

        config = airstream.CompilerConfig()
        config.mode = mode
        backend = airstream.get_backend(config)
        compiled = torch.compile(_model(*_weights()), backend=backend, fullgraph=True)
        outs = [compiled(_input(rank)) for _ in range(3)]
        plan = backend.graphs[-1].plan
        reasons = sorted({s.reason for s in plan.syncs})
        streams = sorted(str(s.label) for s in plan.streams if s.runs)
        results.put((rank, [o.tolist() for o in outs], reasons, streams, None))
    except BaseException as exc:  # reported to the test, which fails with it
        results.put((rank, None, None, None, repr(exc)))
    finally:
        dist.destroy_process_group()


def _reference() -> torch.Tensor:
    w1, w2 = _weights()
    xs = [_input(r) for r in range(WORLD)]
    a = sum(x @ w1 for x in xs)
    c = sum((x @ w2).relu() for x in xs)
    return a * 2 + c


def _run(mode: str) -> dict[int, tuple[Any, ...]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, mode, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(WORLD):
            rank, *rest = results.get(timeout=TIMEOUT_S)
            out[rank] = tuple(rest)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return out


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_collectives_on_two_streams_match_a_single_process(mode: str) -> None:
    got = _run(mode)
    want = _reference()
    for rank in range(WORLD):
        outs, reasons, streams, error = got[rank]
        assert error is None, f"rank {rank}: {error}"
        assert streams == ["None", "comm"], streams
        # the second collective (main) is issued after the first (comm) on every rank
        assert "collective" in reasons, reasons
        for out in outs:
            torch.testing.assert_close(torch.tensor(out), want, rtol=1e-4, atol=1e-4)
