"""Functional collectives in compiled graphs, 2 ranks over gloo on localhost.

Each test spawns 2 processes (bounded: a hung rank fails the test), compiles the same model with
airstream on both, and compares with a single-process reference. Marked ``distributed`` so that
``-m "not distributed"`` deselects them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.conftest import slow

from airstream.bench.ranks import run_ranks
from airstream.torch_internals import functional_collectives

funcol = functional_collectives()

pytestmark = pytest.mark.distributed

WORLD = 2
# the default set's 2-rank test
_FAST = "tests/test_distributed.py::test_collectives_on_two_streams_match_a_single_process"
TIMEOUT_S = 120


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)


def _input(rank: int) -> torch.Tensor:
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(100 + rank))


def _model(w1: torch.Tensor, w2: torch.Tensor) -> Any:
    import airstream

    def model(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("comm"):  # the first collective on a side stream...
            a = funcol.all_reduce(x @ w1, "sum", dist.group.WORLD)
        b = (x @ w2).relu()
        c = funcol.all_reduce(b, "sum", dist.group.WORLD)  # ...the second on main
        return a * 2 + c

    return model


def _streams_case(rank: int, mode: str) -> tuple[Any, ...]:
    import airstream

    config = airstream.CompilerConfig()
    if mode == "run_eagerly":
        config.debug.run_eagerly = True
    else:
        config.mode = mode
    backend = airstream.get_backend(config)
    compiled = torch.compile(_model(*_weights()), backend=backend, fullgraph=True)
    outs = [compiled(_input(rank)) for _ in range(3)]
    plan = backend.graphs[-1].plan
    reasons = sorted({s.reason for s in plan.syncs})
    streams = sorted(str(s.label) for s in plan.streams if s.runs)
    return [o.tolist() for o in outs], reasons, streams


def _all_collectives(x: torch.Tensor) -> torch.Tensor:
    import airstream

    group = dist.group.WORLD
    with airstream.stream("c1"):
        a = funcol.all_gather_tensor(x.sin(), 0, group)
    b = funcol.reduce_scatter_tensor(x.cos(), "sum", 0, group)
    with airstream.stream("c2"):
        c = funcol.all_to_all_single(x * 2, None, None, group)
    d = funcol.all_reduce(x + 1, "sum", group)
    return torch.cat([a.sum(0), b.sum(0), c.sum(0), d.sum(0)])


def _all_collectives_case(rank: int) -> tuple[Any, ...]:
    import airstream

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(rank))
    want = _all_collectives(x)  # eager: the real collectives
    got = {}
    for mode in ("reduce-overhead", "max-autotune", "run_eagerly"):
        config = airstream.CompilerConfig()
        if mode == "run_eagerly":
            config.debug.run_eagerly = True
        else:
            config.mode = mode
        backend = airstream.get_backend(config)
        compiled = torch.compile(_all_collectives, backend=backend, fullgraph=True)
        got[mode] = (compiled(x) - want).abs().max().item()
        got[mode + " collective syncs"] = sum(
            s.reason == "collective" for s in backend.graphs[-1].plan.syncs
        )
        torch.compiler.reset()
    return (got,)


def _tp_case(rank: int, train: bool) -> tuple[Any, ...]:
    import airstream
    from airstream.bench.tp import TPModel

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = airstream.passes.overlap_communication()
    backend = airstream.get_backend(config)
    model = TPModel(2, 32, rank, WORLD)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = _input(0).repeat(1, 2).requires_grad_(train)  # the same input on every rank
    if not train:
        with torch.no_grad():
            out = compiled(x)
        graph = backend.graphs[-1]
        on_comm = sorted(
            str(n.target)
            for n in graph.graph_module.graph.nodes
            if graph.streams.stream_of.get(n.name) == "comm" and "c10d" in str(n.target)
        )
        return out.tolist(), on_comm
    compiled(x).square().sum().backward()
    grads = {name: p.grad.tolist() for name, p in model.named_parameters()}
    return grads, x.grad.tolist()


def _worker(rank: int, world: int, case: str) -> tuple[Any, ...]:
    if case.startswith("streams:"):
        return _streams_case(rank, case.split(":", 1)[1])
    if case == "all-collectives":
        return _all_collectives_case(rank)
    return _tp_case(rank, train=case == "tp-train")


def _reference() -> torch.Tensor:
    w1, w2 = _weights()
    xs = [_input(r) for r in range(WORLD)]
    a = sum(x @ w1 for x in xs)
    c = sum((x @ w2).relu() for x in xs)
    return a * 2 + c


def _run(case: str) -> dict[int, tuple[Any, ...]]:
    return run_ranks(WORLD, _worker, case, timeout_s=TIMEOUT_S, what=case)


@pytest.mark.parametrize(
    "mode",
    [
        "reduce-overhead",
        pytest.param("max-autotune", marks=slow("2 ranks compiling C++ kernels", _FAST)),
        pytest.param("run_eagerly", marks=slow("2 more ranks", _FAST)),
    ],
)
def test_collectives_on_two_streams_match_a_single_process(mode: str) -> None:
    got = _run(f"streams:{mode}")
    want = _reference()
    for rank in range(WORLD):
        outs, reasons, streams = got[rank]
        if mode == "run_eagerly":  # the serial reference executor: same plan, one thread
            streams = ["None", "comm"]
        assert streams == ["None", "comm"], streams
        # the second collective (main) is issued after the first (comm) on every rank
        assert "collective" in reasons, reasons
        for out in outs:
            torch.testing.assert_close(torch.tensor(out), want, rtol=1e-4, atol=1e-4)


@slow("2 more ranks", _FAST)
def test_overlap_communication_on_a_tensor_parallel_stack_matches_one_process() -> None:
    from airstream.bench.tp import TPReference

    got = _run("tp-infer")
    x = _input(0).repeat(1, 2)
    want = TPReference(2, 32)(x)
    for rank in range(WORLD):
        out, on_comm = got[rank]
        torch.testing.assert_close(torch.tensor(out), want, rtol=1e-4, atol=1e-4)
        # both layers' all_reduce and its wait run on the communication stream
        assert on_comm.count("_c10d_functional.all_reduce.default") == 2, on_comm
        assert on_comm.count("_c10d_functional.wait_tensor.default") == 2, on_comm


@slow("2 more ranks, forward and backward", _FAST)
def test_a_training_step_over_two_ranks_gives_the_single_process_gradients() -> None:
    from airstream.bench.tp import TPReference, layer_weights

    got = _run("tp-train")
    # the reference: full weights as leaves, the same loss
    weights = [
        {k: v.clone().requires_grad_(True) for k, v in layer_weights(i, 32).items()}
        for i in range(2)
    ]
    ref = TPReference(2, 32)
    ref.weights = weights
    x = _input(0).repeat(1, 2).requires_grad_(True)
    ref(x).square().sum().backward()
    rows = 4 * 32 // WORLD
    for rank in range(WORLD):
        grads, x_grad = got[rank]
        torch.testing.assert_close(torch.tensor(x_grad), x.grad, rtol=1e-4, atol=1e-4)
        part = slice(rank * rows, (rank + 1) * rows)
        for i, w in enumerate(weights):
            want = {
                "w1": w["w1"].grad[part],
                "b1": w["b1"].grad[part],
                "w2": w["w2"].grad[:, part],
                "b2": w["b2"].grad,
                "branch.weight": w["wb"].grad,
                "branch.bias": w["bb"].grad,
            }
            for name, value in want.items():
                torch.testing.assert_close(
                    torch.tensor(grads[f"layers.{i}.{name}"]),
                    value,
                    rtol=1e-4,
                    atol=1e-4,
                    msg=f"rank {rank} layers.{i}.{name}",
                )


@slow("2 more ranks, 3 modes each", _FAST)
def test_all_gather_reduce_scatter_all_to_all_and_all_reduce_on_three_streams() -> None:
    got = _run("all-collectives")
    for rank in range(WORLD):
        (result,) = got[rank]
        for mode in ("reduce-overhead", "max-autotune", "run_eagerly"):
            assert result[mode] < 1e-5, (rank, mode, result)
            # 4 collectives on 3 streams: each issued after the previous one
            assert result[mode + " collective syncs"] == 3, (rank, mode, result)


@slow("torchrun starting 2 fresh ranks", _FAST)
def test_the_tp_example_runs_under_torchrun() -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(root / "examples" / "tp_overlap.py"),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in range(WORLD):
        assert f"rank {rank}/2: result equals the single-process model: True" in result.stdout
    assert "comm" in result.stdout  # rank 0 printed the plan with the communication stream


def test_a_rank_that_dies_without_answering_fails_the_run_at_once() -> None:
    """A rank that exits before it answers (a crash, an init that failed) fails the run with its
    exit code, instead of the parent waiting out the timeout for an answer that never comes."""
    import os
    import time

    from airstream.bench.ranks import run_in_child

    start = time.monotonic()
    said = r"dies: ended without an answer \(rank 0: exit code 3\)"
    with pytest.raises(RuntimeError, match=said):
        run_in_child(os._exit, 3, timeout_s=600.0, what="dies")
    assert time.monotonic() - start < 60
