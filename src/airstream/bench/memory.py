"""``airstream bench memory``: peak memory of a training step and of inference, per runner.

The model is a chain of ``layers`` x (Linear(hidden, hidden) + GELU) at ``batch`` rows. Runners:
eager, ``aot_eager``, Inductor, airstream on 1 stream, airstream on 2 streams (odd layers on a
side stream, in the forward and backward graphs). Each (runner, workload) runs in a fresh
process, so one runner's allocations, caches and compile never count against another's.

What is measured: compile and warm up (2 steps), then for each of ``steps`` steps the peak
resident memory of the process during the step (Linux: the peak is reset through
``/proc/self/clear_refs`` before the step and read from ``VmHWM`` after it), and that peak minus
the resident memory just before the step (what the step itself allocates; memory a runner keeps
between steps shows in the first figure only); medians are reported. The
worker processes run with glibc's ``MALLOC_MMAP_THRESHOLD_`` at 64 KiB, so every tensor buffer is
its own mapping and is returned to the system when freed: resident memory then follows the
tensors alive, not what the allocator keeps cached.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["RUNNERS", "WORKLOADS", "format_memory", "run_memory"]

RUNNERS = ("eager", "aot_eager", "inductor", "airstream", "airstream-2-streams")
WORKLOADS = ("training", "inference")
_MIB = 1 << 20


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {key}")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size


def _model(layers: int, hidden: int) -> Any:
    import torch

    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(hidden, hidden) for _ in range(layers)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.nn.functional.gelu(layer(x))
            return x

    torch.manual_seed(0)
    return Chain()


def _odd_layers_on_side(gm: Any, example_inputs: Any, config: Any) -> None:
    from airstream import passes

    nodes = passes.select_nodes(gm, module=r"layers\.\d*[13579]\b")
    if nodes:
        passes.place_on_stream(gm, nodes, "side")


def _compiled(runner: str, model: Any) -> Callable[..., Any]:
    import torch

    if runner == "eager":
        return model
    if runner in ("aot_eager", "inductor"):
        return torch.compile(model, backend=runner)
    import airstream

    config = airstream.CompilerConfig()
    if runner == "airstream-2-streams":
        config.post_grad_custom_pre_pass = _odd_layers_on_side
    return torch.compile(model, backend=airstream.get_backend(compiler_config=config))


def _worker(runner: str, workload: str, layers: int, hidden: int, batch: int, steps: int) -> dict:
    import torch

    torch.manual_seed(0)
    model = _model(layers, hidden)
    run = _compiled(runner, model)
    x = torch.randn(batch, hidden)

    def step() -> None:
        if workload == "training":
            model.zero_grad(set_to_none=True)
            run(x).sum().backward()
        else:
            with torch.no_grad():
                run(x)

    for _ in range(2):  # compile, then one warm step
        step()
    peaks, above = [], []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)  # what the step frees first is not counted as peak
        gc.collect()
        _reset_peak()
        before = _status("VmRSS")
        step()
        peak = _status("VmHWM")
        peaks.append(peak)
        above.append(peak - before)
    return {
        "runner": runner,
        "workload": workload,
        "peak_bytes": statistics.median(peaks),
        "step_bytes": statistics.median(above),
    }


def run_memory(
    *,
    layers: int = 8,
    hidden: int = 1024,
    batch: int = 4096,
    steps: int = 3,
    runners: Sequence[str] = RUNNERS,
    workloads: Sequence[str] = WORKLOADS,
) -> dict:
    """Peak memory above the pre-step baseline, per workload and runner (one process each)."""
    if not os.path.exists("/proc/self/clear_refs"):
        raise RuntimeError("airstream bench memory needs Linux (/proc/self/clear_refs)")
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
    results: dict[str, dict[str, float]] = {w: {} for w in workloads}
    step: dict[str, dict[str, float]] = {w: {} for w in workloads}
    for workload in workloads:
        for runner in runners:
            argv = [
                sys.executable,
                "-m",
                "airstream.bench.memory",
                runner,
                workload,
                str(layers),
                str(hidden),
                str(batch),
                str(steps),
            ]
            done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(
                    f"bench memory: the {runner} {workload} worker failed:\n{done.stderr[-3000:]}"
                )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results[workload][runner] = result["peak_bytes"]
            step[workload][runner] = result["step_bytes"]
    return {
        "layers": layers,
        "hidden": hidden,
        "batch": batch,
        "steps": steps,
        "peak_bytes": results,
        "step_bytes": step,
    }


def format_memory(report: dict) -> str:
    """The report as a table: MiB per runner, and the ratios to ``aot_eager``."""
    lines = [
        f"peak memory of one step: {report['layers']} x (Linear({report['hidden']}, "
        f"{report['hidden']}) + GELU), batch {report['batch']}; median of {report['steps']} "
        "steps, each runner in its own process",
        f"    {'runner':<22}{'process peak':>14}{'':>16}{'step allocates':>16}",
    ]
    for workload, peaks in report["peak_bytes"].items():
        steps = report["step_bytes"][workload]
        base, base_step = peaks.get("aot_eager"), steps.get("aot_eager")
        lines.append(f"  {workload}:")
        for runner, peak in peaks.items():
            ratio = f"{peak / base:6.2f}x aot_eager" if base else ""
            step = steps[runner]
            step_ratio = f"{step / base_step:6.2f}x" if base_step else ""
            lines.append(
                f"    {runner:<22}{peak / _MIB:9.1f} MiB {ratio:>16}"
                f"{step / _MIB:11.1f} MiB {step_ratio}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    name, kind, *numbers = sys.argv[1:]
    n_layers, n_hidden, n_batch, n_steps = (int(v) for v in numbers)
    print(json.dumps(_worker(name, kind, n_layers, n_hidden, n_batch, n_steps)))
