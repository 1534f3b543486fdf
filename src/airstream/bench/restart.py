"""``airstream bench restart``: the first call of a new process, cold and warm, as a serving
process restarting sees it.

Each case runs in fresh processes with its own cache directories (airstream's and Inductor's,
emptied before the round): ``cold`` is the first process, ``warm`` a second one on the caches the
first left. A process imports torch and transformers, builds the decode model (``bench decode``'s
Qwen2-MoE-style model, random weights), fills a static KV cache with an eager prefill, and times
its first decode step, which compiles (or loads) and runs. Cases:

- ``inductor``: ``torch.compile(model.forward)`` (Inductor's FX graph and AOTAutograd caches);
- ``airstream <mode>``: ``torch.compile`` with airstream's backend, per mode (``default`` is
  max-autotune on CPU);
- ``cache_compile <mode>``: :func:`airstream.cache_compile` on ``model.forward`` (the entry on
  disk; max-autotune's segments from Inductor's cache);
- ``auto_streams <mode>``: ``torch.compile`` with ``passes.auto_streams()``, its placement
  measured against one stream (``stream_config.measure_placement``, the default ``"auto"``: a
  second compile where it places streams); ``auto_streams-predicted <mode>``: the same with
  the measuring off. The step timings then include the measuring's first calls (and the other
  candidates' compiles, each at its first turn); after them the process calls on until the
  measuring has decided, as a serving process would, so the warm process finds the decision on
  disk (``AIRSTREAM_DECISIONS``) and measures nothing; the report says how long after
  ``torch.compile`` the decision came.

Medians of ``rounds`` cold/warm pairs, the cases interleaved (each round runs every case once);
warm/cold is the figure the cache is judged by. The first call's time starts at
``torch.compile`` (``torch.compile(backend="inductor")`` imports Inductor there).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["RESTART_CASES", "format_restart", "run_restart"]

STEPS = 10  # decode steps timed after the first call (their median: the steady state)

RESTART_CASES = (
    "inductor",
    "airstream reduce-overhead",
    "cache_compile reduce-overhead",
    "airstream max-autotune",
    "cache_compile max-autotune",
    "auto_streams max-autotune",
    "auto_streams-predicted max-autotune",
)


def _pair(model: str, case: str) -> dict[str, float]:
    """One cold and one warm process of ``case``, on caches of their own."""
    with tempfile.TemporaryDirectory(prefix="airstream-restart-") as root:
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=os.path.join(root, "inductor"),
            AIRSTREAM_CACHE_DIR=os.path.join(root, "airstream"),
        )
        out: dict[str, float] = {}
        for state in ("cold", "warm"):
            result = subprocess.run(
                [sys.executable, "-m", "airstream.bench.restart", model, case],
                env=env,
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if result.returncode != 0:
                raise RuntimeError(
                    f"bench restart: {case} ({state}) failed:\n{result.stderr[-3000:]}"
                )
            report = json.loads(result.stdout.strip().splitlines()[-1])
            out[state] = report["first_call"]
            out[f"{state}_setup"] = report["setup"]
            out[f"{state}_step_ms"] = report["step_ms"]
            if case.startswith("cache_compile"):
                out[f"{state}_loaded"] = report["loaded"]
            if report["measured"]:
                out[f"{state}_measured"] = report["measured"]
    return out


def run_restart(
    model: str = "qwen2-moe", cases: Sequence[str] = RESTART_CASES, rounds: int = 1
) -> dict[str, Any]:
    """Median first-call seconds, cold and warm, of each case."""
    import torch

    runs: dict[str, list[dict[str, float]]] = {case: [] for case in cases}
    for _ in range(rounds):  # the cases interleaved: round by round, each case once
        for case in cases:
            runs[case].append(_pair(model, case))
    rows = []
    for case, pairs in runs.items():
        row: dict[str, Any] = {"case": case}
        for field in pairs[0]:
            values = [p[field] for p in pairs]
            if field.endswith("_loaded"):
                row[field] = all(values)
            elif field.endswith("_measured"):
                row[field] = values[-1]  # the last round's decisions, as words
            else:
                row[field] = statistics.median(values)
        rows.append(row)
    return {
        "benchmark": "restart",
        "model": model,
        "rounds": rounds,
        "torch": torch.__version__,
        "rows": rows,
    }


def format_restart(report: dict[str, Any]) -> str:
    """The report as a table."""
    lines = [
        f"first call of a new process, {report['model']} decode step (torch {report['torch']}; "
        f"median of {report['rounds']} cold/warm pairs, each case on caches of its own)",
        f"  {'case':<38}{'cold s':>8}{'warm s':>8}{'warm/cold':>11}{'setup s':>9}{'step ms':>9}",
    ]
    for row in report["rows"]:
        ratio = row["warm"] / row["cold"]
        loaded = (
            ""
            if "warm_loaded" not in row
            else ("  (loaded)" if row["warm_loaded"] else "  (NOT loaded)")
        )
        lines.append(
            f"  {row['case']:<38}{row['cold']:>8.2f}{row['warm']:>8.2f}{ratio:>10.0%} "
            f"{row['warm_setup']:>8.2f}{row['warm_step_ms']:>9.1f}{loaded}"
        )
        for state in ("cold", "warm"):
            if f"{state}_measured" in row:
                lines.append(f"    {state}: {row[f'{state}_measured']}")
    lines.append(
        "  setup = the warm process's import, model build and eager prefill (not in the first "
        "call); step = the median of the warm process's next 10 decode steps"
    )
    return "\n".join(lines)


def _child(model_name: str, case: str) -> dict[str, Any]:
    start = time.perf_counter()
    import torch

    import airstream
    from airstream.bench.decode import build_model, decode_step, measure_until_decided

    model, _ = build_model(model_name)
    kind, _, mode = case.partition(" ")
    loaded = None
    if kind == "inductor":
        backend: Any = "inductor"
    else:
        config = airstream.CompilerConfig()
        config.mode = mode
        if kind.startswith("auto_streams"):
            config.post_grad_custom_pre_pass = airstream.passes.auto_streams()
            config.stream_config.measure_placement = "auto" if kind == "auto_streams" else False
        backend = airstream.get_backend(compiler_config=config)
    if kind == "cache_compile":
        cached = airstream.cache_compile(model.forward, config=config)
        step, first = decode_step(model, None, 4, 32, 64, forward=cached)
        loaded = cached.loaded
    else:
        step, first = decode_step(model, backend, 4, 32, 64)
    setup = time.perf_counter() - start - first
    steps = []
    for _ in range(STEPS):
        began = time.perf_counter()
        step()
        steps.append(time.perf_counter() - began)
    measured = ""
    if kind == "auto_streams":  # on until it has decided, as a serving process would be
        began = time.perf_counter()
        measured = measure_until_decided(backend, step)
        decided = first + sum(steps) + time.perf_counter() - began
        measured = f"{measured} [decided {decided:.2f} s after torch.compile]"
    del torch
    return {
        "first_call": first,
        "setup": setup,
        "loaded": loaded,
        "step_ms": 1e3 * statistics.median(steps),
        "measured": measured,
    }


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], sys.argv[2])))
