"""``airstream bench decode --alone``: each runner of ``bench decode`` in a process of its own.

Interleaved in one process, every runner shares the process's state: its threads, its allocator,
what an earlier runner's compile or measuring left behind. A serving process runs one
configuration, so this form times each alone: per round, one fresh process per runner (the
order rotating from round to round), each building the model, compiling, calling until its
measuring has decided (``auto_streams``: measured afresh, ``AIRSTREAM_DECISIONS=off``, as a
first deployment does), warming up and timing ``steps`` decode steps, whose median is the
process's figure. The report gives each runner's median over the rounds and, per mode,
``auto_streams`` over one stream: per round and the median of those ratios.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["alone_runners", "format_alone", "run_alone"]

WARMUP = 3


def alone_runners(modes: Sequence[str]) -> list[str]:
    """The runners timed: Inductor, and one stream and ``auto_streams`` in each of ``modes``."""
    return ["inductor", *(f"{r} {m}" for m in modes for r in ("airstream", "auto_streams"))]


def _backend(runner: str) -> Any:
    """The ``torch.compile`` backend of ``runner`` (``inductor`` or ``<config> <mode>``)."""
    import airstream
    from airstream import passes
    from airstream.torch_internals import compile_fx

    if runner == "inductor":
        return compile_fx
    name, mode = runner.split(" ")
    config = airstream.CompilerConfig()
    config.mode = mode
    if name == "auto_streams":
        config.post_grad_custom_pre_pass = passes.auto_streams()
    return airstream.get_backend(compiler_config=config)


def _child(model_name: str, runner: str, batch: int, steps: int) -> dict[str, Any]:
    """In the child process: ``runner``'s compile, its decisions and its median step."""
    import torch

    from airstream.bench.decode import build_model, decode_step, measure_until_decided

    model, _ = build_model(model_name)
    backend = _backend(runner)
    prompt = 32
    step, first = decode_step(model, backend, batch, prompt, prompt + 8)
    measured = measure_until_decided(backend, step) if runner.startswith("auto") else ""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {
        "step_ms": statistics.median(times) * 1e3,
        "compile_s": first,
        "measured": measured,
        "threads": torch.get_num_threads(),
    }


def _one(model: str, runner: str, batch: int, steps: int) -> dict[str, Any]:
    """``runner`` in a fresh process."""
    env = dict(os.environ, AIRSTREAM_DECISIONS="off")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "airstream.bench.decode_alone",
            model,
            runner,
            str(batch),
            str(steps),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if result.returncode != 0:
        raise RuntimeError(f"bench decode --alone: {runner} failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def run_alone(
    models: Sequence[str], modes: Sequence[str], rounds: int, steps: int, batch: int
) -> dict[str, Any]:
    """Per model, each runner's per-process medians (ms) over ``rounds`` rounds."""
    import torch

    runners = alone_runners(modes)
    report: dict[str, Any] = {
        "benchmark": "decode --alone",
        "torch": torch.__version__,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0,
        "rounds": rounds,
        "steps": steps,
        "batch": batch,
        "modes": list(modes),
        "models": {},
    }
    for model in models:
        runs: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
        for round_ in range(rounds):
            shift = round_ % len(runners)  # each runner first in turn
            for runner in runners[shift:] + runners[:shift]:
                runs[runner].append(_one(model, runner, batch, steps))
        report["models"][model] = runs
    return report


def _ratios(runs: dict[str, list[dict[str, Any]]], mode: str) -> list[float]:
    one, auto = runs[f"airstream {mode}"], runs[f"auto_streams {mode}"]
    return [o["step_ms"] / a["step_ms"] for o, a in zip(one, auto, strict=True)]


def format_alone(report: dict[str, Any]) -> str:
    """The report as text."""
    lines = [
        f"decode --alone: B={report['batch']}, each runner in a fresh process per round "
        f"({report['rounds']} rounds, the order rotating), median of {report['steps']} steps "
        f"after {WARMUP} warm-up steps per process; auto_streams measured afresh in each; "
        f"torch {report['torch']}, {report['cores']} cores"
    ]
    for model, runs in report["models"].items():
        lines.append(f"  {model}:")
        for runner, results in runs.items():
            ms = [r["step_ms"] for r in results]
            lines.append(
                f"    {runner:<28} {statistics.median(ms):8.2f} ms/step  "
                f"(rounds {', '.join(f'{m:.1f}' for m in ms)})"
            )
        for mode in report["modes"]:
            ratios = _ratios(runs, mode)
            lines.append(
                f"    auto_streams / one stream, {mode}: {statistics.median(ratios):.3f}x "
                f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}); kept: "
                f"{runs[f'auto_streams {mode}'][-1]['measured'] or 'nothing measured'}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    name, runner_name, batch_text, steps_text = sys.argv[1:5]
    print(json.dumps(_child(name, runner_name, int(batch_text), int(steps_text))))
