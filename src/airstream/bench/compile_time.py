"""``airstream bench compile``: how long airstream takes to compile each model of the model suite.

Each case compiles the model afresh (``torch.compiler.reset()``) and calls it once. Two times are
reported: ``backend``, the seconds spent inside airstream's backend (AOTAutograd, the passes, the
plan, code generation: airstream's own work), and ``first call``, the whole first call (Dynamo's
trace included). Medians of ``rounds`` compiles, in one process.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["COMPILE_CONFIGS", "format_compile", "run_compile"]

COMPILE_CONFIGS = ("default", "auto_streams")


class _Timed:
    """A Dynamo backend that adds up the seconds its inner backend takes."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.seconds = 0.0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        start = time.perf_counter()
        try:
            return self.backend(gm, example_inputs)
        finally:
            self.seconds += time.perf_counter() - start


def _once(arch: Any, config: str) -> tuple[float, float]:
    import airstream
    from airstream.selftest.models import LENGTHS, _inputs, airstream_config

    torch.compiler.reset()
    model = arch.build()
    timed = _Timed(airstream.get_backend(compiler_config=airstream_config(arch, config)))
    compiled = torch.compile(model, backend=timed)
    inputs = _inputs(arch, LENGTHS[0])
    with torch.no_grad():
        start = time.perf_counter()
        compiled(**inputs)
        total = time.perf_counter() - start
    torch.compiler.reset()
    return timed.seconds, total


def run_compile(
    models: Sequence[str], configs: Sequence[str] = COMPILE_CONFIGS, rounds: int = 3
) -> dict[str, Any]:
    """Median compile seconds of each model in each configuration."""
    from airstream.selftest.architectures import ARCHS

    rows = []
    for name in models:
        for config in configs:
            samples = [_once(ARCHS[name], config) for _ in range(rounds)]
            rows.append(
                {
                    "model": name,
                    "config": config,
                    "backend_s": statistics.median(s[0] for s in samples),
                    "first_call_s": statistics.median(s[1] for s in samples),
                }
            )
    return {"benchmark": "compile", "rounds": rounds, "torch": torch.__version__, "rows": rows}


def format_compile(report: dict[str, Any]) -> str:
    """The report as a table with totals."""
    lines = [
        f"compile times, median of {report['rounds']} fresh compiles each (torch "
        f"{report['torch']}; backend = airstream's own work, first call = with Dynamo's trace)",
        f"  {'model':<14}{'config':<14}{'backend s':>10}{'first call s':>14}",
    ]
    for row in report["rows"]:
        lines.append(
            f"  {row['model']:<14}{row['config']:<14}{row['backend_s']:>10.3f}"
            f"{row['first_call_s']:>14.3f}"
        )
    backend = sum(r["backend_s"] for r in report["rows"])
    total = sum(r["first_call_s"] for r in report["rows"])
    lines.append(f"  {'total':<28}{backend:>10.2f}{total:>14.2f}")
    return "\n".join(lines)
