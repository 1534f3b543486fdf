"""``airstream bench <model> --mode ...``: reduce-overhead vs max-autotune, next to eager and
Inductor, and compile times with a cold and a warm Inductor cache.

Models: ``branches-pointwise`` (N independent branches, each a Linear then a chain of pointwise
ops, summed) and ``moe`` (the dense MoE block of ``airstream bench moe``). 2 streams: branch /
expert ``i`` on stream ``i % 2`` by :func:`airstream.bench.moe.split_experts` (a pass: the model
code is not edited), 1 intra-op thread per stream; 1-stream airstream runs with torch's default
intra-op threads, like Inductor and eager.

``hand-written threads (Inductor parts)`` is the ceiling of a 2-way split on this machine: each
branch or expert compiled alone by Inductor, its kernels bound as airstream's are
(``AIRSTREAM_KERNEL_GIL``), odd ones on a persistent Python thread, no compiler runtime in between.

Compile time is the first call of a freshly compiled model in a fresh process (Dynamo, AOT,
passes, Inductor and the first run), with an empty Inductor cache directory (cold) and then again
in a second process with the same directory (warm).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from airstream.backend import get_backend
from airstream.bench.kernel_split import HandSplit, inductor_parts
from airstream.bench.moe import MoE, split_experts
from airstream.bench.timing import checked_medians, run_conditions, synchronized, with_threads
from airstream.options.config import CompilerConfig

__all__ = [
    "MODE_MODELS",
    "BranchesPointwise",
    "PointwiseBranch",
    "compile_time",
    "format_modes",
    "run_modes",
]

MODE_MODELS = ("branches-pointwise", "moe")
MODES = ("reduce-overhead", "max-autotune")


class PointwiseBranch(torch.nn.Module):
    """``Linear(H, H)`` followed by a chain of ``pointwise`` elementwise ops."""

    def __init__(self, hidden: int, pointwise: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden, hidden)
        self.pointwise = pointwise

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        for i in range(self.pointwise):
            step = i % 5
            if step == 0:
                y = torch.nn.functional.gelu(y)
            elif step == 1:
                y = y * 1.5 + 0.25
            elif step == 2:
                y = torch.tanh(y)
            elif step == 3:
                y = torch.sigmoid(y) * y
            else:
                y = y - y.abs() * 0.125
        return y


class BranchesPointwise(torch.nn.Module):
    """``branches`` independent :class:`PointwiseBranch` es on the same input, summed."""

    def __init__(self, branches: int = 4, hidden: int = 1024, pointwise: int = 10) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList(
            PointwiseBranch(hidden, pointwise) for _ in range(branches)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total


def _model(
    name: str, tokens: int, hidden: int, device: str = "cpu"
) -> tuple[torch.nn.Module, torch.Tensor, str]:
    """The model, its input, and the module-path pattern that numbers its parallel parts."""
    torch.manual_seed(0)
    if name == "branches-pointwise":
        model: torch.nn.Module = BranchesPointwise(4, hidden, 10)
        pattern = r"branches\.(\d+)"
    elif name == "moe":
        model = MoE(8, hidden)
        pattern = r"experts\.(\d+)"
    else:
        raise ValueError(f"no --mode benchmark for model {name!r}; choose from {MODE_MODELS}")
    return model.eval().to(device), torch.randn(tokens, hidden, device=device), pattern


def _airstream(model: torch.nn.Module, mode: str, streams: int, pattern: str) -> Any:
    config = CompilerConfig()
    config.mode = mode
    if streams > 1:
        config.post_grad_custom_pre_pass = split_experts(streams, pattern)
    backend = get_backend(config)
    return torch.compile(model, backend=backend), backend


def run_modes(
    name: str,
    modes: tuple[str, ...] = MODES,
    tokens: int = 8,
    hidden: int = 1024,
    rounds: int = 15,
    calls: int = 20,
    inductor: bool = True,
    compile_times: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Time eager, Inductor and airstream in each mode on 1 and 2 streams; medians (ms).

    On a CUDA ``device`` every timed call ends with a synchronize and the hand-written CPU
    threads are left out."""
    threads = torch.get_num_threads()
    cuda = device.startswith("cuda")
    model, x, pattern = _model(name, tokens, hidden, device)
    candidates: dict[str, Callable[[], Any]] = {
        "eager": with_threads(threads, lambda: model(x)),
    }
    if inductor:
        opt = torch.compile(model)
        candidates["inductor"] = with_threads(threads, lambda: opt(x))
    backends = {}
    for mode in modes:
        for streams in (1, 2):
            compiled, backend = _airstream(model, mode, streams, pattern)
            runner = f"airstream {mode} {streams} stream{'s' if streams > 1 else ''}"
            candidates[runner] = with_threads(threads, functools.partial(compiled, x))
            backends[runner] = backend
    parts = list(getattr(model, "branches" if name == "branches-pointwise" else "experts"))
    if inductor and not cuda:
        candidates["hand-written threads (Inductor parts)"] = with_threads(
            1, HandSplit(inductor_parts(parts, x), x)
        )
    candidates = {runner: synchronized(device, fn) for runner, fn in candidates.items()}
    with torch.no_grad():
        want = model(x)
    # One untimed call per runner and round: the runner before may leave OpenMP workers spinning
    # (2 intra-op threads), which would bill a 1-thread-per-stream runner for a core it lacks.
    medians = checked_medians(candidates, want, rounds=rounds, calls_per_round=calls, settle=1)
    segments = {
        runner: sum(1 for g in b.graphs for s in g.segments if s.node is not None)
        for runner, b in backends.items()
    }
    report: dict[str, Any] = {
        "benchmark": f"{name} --mode",
        "model": name,
        "tokens": tokens,
        "hidden": hidden,
        **run_conditions(rounds, calls, device),
        "ms": {k: v * 1e3 for k, v in medians.items()},
        "segments": segments,
        "streams_used": {
            runner: len([s for s in b.graphs[-1].plan.streams if s.runs])
            for runner, b in backends.items()
        },
    }
    if compile_times:
        runners = [r for r in ("inductor", *backends) if r in candidates]
        report["compile_s"] = {
            r: compile_time(name, r, tokens=tokens, hidden=hidden, device=device) for r in runners
        }
    return report


def compile_time(
    name: str, runner: str, tokens: int = 8, hidden: int = 1024, device: str = "cpu"
) -> dict[str, float]:
    """First-call seconds of ``runner`` on model ``name`` in fresh processes: ``cold`` (empty
    Inductor cache) and ``warm`` (a second process on the same cache)."""
    with tempfile.TemporaryDirectory(prefix="airstream-compile-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        out = {}
        for state in ("cold", "warm"):
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "airstream.bench.modes",
                    name,
                    runner,
                    str(tokens),
                    str(hidden),
                    device,
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                timeout=900,
            )
            out[state] = json.loads(result.stdout.strip().splitlines()[-1])["seconds"]
    return out


def _first_call(name: str, runner: str, tokens: int, hidden: int, device: str) -> float:
    model, x, pattern = _model(name, tokens, hidden, device)
    if runner == "inductor":
        compiled = torch.compile(model)
    else:
        _, mode, streams, _ = runner.split(" ")
        compiled, _ = _airstream(model, mode, int(streams), pattern)
    start = time.perf_counter()
    with torch.no_grad():
        synchronized(device, functools.partial(compiled, x))()
    return time.perf_counter() - start


def format_modes(report: dict[str, Any]) -> str:
    """The report as a table."""
    ms = report["ms"]
    reference = ms.get("inductor", ms["eager"])
    ref_name = "inductor" if "inductor" in ms else "eager"
    lines = [
        f"{report['model']}: B={report['tokens']}, H={report['hidden']}, float32; "
        f"{report['device']}, {report['cores']} cores, torch {report['torch']}; "
        f"{report['rounds']} interleaved "
        f"rounds x {report['calls_per_round']} calls (after 1 untimed call), medians",
        f"{'runner':<38}{'ms':>9}{'vs ' + ref_name:>14}{'segments':>10}{'streams':>9}",
    ]
    for runner, value in ms.items():
        segs = report["segments"].get(runner, "")
        used = report["streams_used"].get(runner, "")
        lines.append(f"{runner:<38}{value:>9.2f}{reference / value:>13.2f}x{segs!s:>10}{used!s:>9}")
    if "compile_s" in report:
        lines.append("compile time (first call, fresh process), seconds:")
        lines.append(f"  {'runner':<36}{'cold cache':>12}{'warm cache':>12}")
        for runner, t in report["compile_s"].items():
            lines.append(f"  {runner:<36}{t['cold']:>12.2f}{t['warm']:>12.2f}")
    return "\n".join(lines)


if __name__ == "__main__":  # one compile-time measurement (see compile_time)
    _name, _runner, _tokens, _hidden, _device = sys.argv[1:6]
    seconds = _first_call(_name, _runner, int(_tokens), int(_hidden), _device)
    print(json.dumps({"seconds": seconds}))
