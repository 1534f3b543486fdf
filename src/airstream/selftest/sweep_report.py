"""Results of the OpInfo sweep (``selftest/opinfo.py``): samples, the per-configuration table,
failure classification, JSON-lines storage and the printed report."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CONFIGS",
    "INDUCTOR_CONFIGS",
    "SampleResult",
    "Sweep",
    "append_results",
    "format_sweep",
    "load_sweep",
    "sweep_report",
]

CONFIGS = (
    "airstream",
    "airstream 3 streams",
    "airstream run_eagerly",
    "airstream max-autotune",
    "airstream max-autotune 3 streams",
    "aot_eager",
    "inductor",
)
# Configurations that compile with Inductor (C++ per sample on CPU: slow for the whole database).
INDUCTOR_CONFIGS = ("airstream max-autotune", "airstream max-autotune 3 streams", "inductor")


@dataclass
class SampleResult:
    """One sample under one configuration: ``pass``, ``fail`` or ``error`` (with a reason)."""

    op: str
    index: int
    config: str
    outcome: str
    reason: str = ""
    fallbacks: int = 0  # max-autotune segments that ran as aten code (Inductor failed)


@dataclass
class Sweep:
    """All results of a sweep, with the per-configuration table."""

    results: list[SampleResult] = field(default_factory=list)
    configs: tuple[str, ...] = CONFIGS
    seconds: float = 0.0

    def table(self) -> dict[str, dict[str, int]]:
        """Per configuration: ops passed (every sample), failed (a wrong result), errored, and
        sample counts."""
        out: dict[str, dict[str, int]] = {}
        for config in self.configs:
            rows = [r for r in self.results if r.config == config and r.outcome != "skip"]
            by_op: dict[str, set[str]] = {}
            for r in rows:
                by_op.setdefault(r.op, set()).add(r.outcome)
            out[config] = {
                "ops_passed": sum(1 for o in by_op.values() if o == {"pass"}),
                "ops_failed": sum(1 for o in by_op.values() if "fail" in o),
                "ops_errored": sum(1 for o in by_op.values() if "error" in o and "fail" not in o),
                "samples": len(rows),
                "samples_passed": sum(1 for r in rows if r.outcome == "pass"),
                "samples_failed": sum(1 for r in rows if r.outcome == "fail"),
                "samples_errored": sum(1 for r in rows if r.outcome == "error"),
                "samples_fallback": sum(1 for r in rows if r.fallbacks),
            }
        return out

    def classified(self) -> list[tuple[SampleResult, str]]:
        """Every airstream failure or error with ``torch`` (aot_eager fails it too; for
        max-autotune, or Inductor does) or ``ours``."""
        bad = ("fail", "error")
        failed = {(r.config, r.op, r.index) for r in self.results if r.outcome in ("fail", "error")}
        out = []
        for r in self.results:
            if r.config.startswith("airstream") and r.outcome in bad:
                theirs = ("aot_eager", r.op, r.index) in failed or (
                    "max-autotune" in r.config and ("inductor", r.op, r.index) in failed
                )
                out.append((r, "torch" if theirs else "ours"))
        return out


def append_results(path: str, results: Sequence[SampleResult]) -> None:
    """Append ``results`` to a JSON-lines file (what :func:`load_sweep` reads)."""
    with open(path, "a") as f:
        f.writelines(json.dumps(asdict(r)) + "\n" for r in results)


def load_sweep(paths: Sequence[str], max_samples: int | None = None) -> dict[str, Any]:
    """The report of one sweep stored by ``run_sweep(results_path=...)`` in one or more files
    (e.g. one per shard)."""
    results = []
    for path in paths:
        with open(path) as f:
            results += [SampleResult(**json.loads(line)) for line in f if line.strip()]
    configs = tuple(dict.fromkeys(r.config for r in results))
    sweep = Sweep(results, tuple(c for c in CONFIGS if c in configs))
    return sweep_report(sweep, len({r.op for r in results}), max_samples)


def sweep_report(sweep: Sweep, ops: int, max_samples: int | None) -> dict[str, Any]:
    classified = sweep.classified()
    return {
        "ops": ops,
        "max_samples": max_samples,
        "seconds": round(sweep.seconds, 1),
        "table": sweep.table(),
        "ours": [
            {
                "op": r.op,
                "sample": r.index,
                "config": r.config,
                "outcome": r.outcome,
                "reason": r.reason,
            }
            for r, who in classified
            if who == "ours"
        ],
        "torch": len([1 for _, who in classified if who == "torch"]),
        "fallback_ops": sorted({f"{r.op} ({r.config})" for r in sweep.results if r.fallbacks}),
        "silent_mismatches_ours": len(
            [1 for r, who in classified if who == "ours" and r.outcome == "fail"]
        ),
    }


def format_sweep(report: dict[str, Any]) -> str:
    """The sweep as a table, then our failures."""
    limit = report["max_samples"]
    samples = "all samples" if limit is None else f"<= {limit} samples per op"
    lines = [
        f"OpInfo sweep: {report['ops']} ops, CPU float32, {samples}, {report['seconds']} s",
        f"{'configuration':<34}{'ops pass':>9}{'fail':>6}{'error':>7}{'samples':>9}"
        f"{'pass':>7}{'fail':>6}{'error':>7}{'aten fallback':>15}",
    ]
    for config, row in report["table"].items():
        lines.append(
            f"{config:<34}{row['ops_passed']:>9}{row['ops_failed']:>6}{row['ops_errored']:>7}"
            f"{row['samples']:>9}{row['samples_passed']:>7}{row['samples_failed']:>6}"
            f"{row['samples_errored']:>7}{row.get('samples_fallback', 0):>15}"
        )
    lines.append(
        f"airstream failures also failing under aot_eager (torch's): {report['torch']}; "
        f"ours: {len(report['ours'])}, of which silent mismatches: "
        f"{report['silent_mismatches_ours']}"
    )
    if report.get("fallback_ops"):
        lines.append(
            "max-autotune segments Inductor could not compile (run as aten code): "
            + ", ".join(report["fallback_ops"])
        )
    for row in report["ours"]:
        lines.append(
            f"  {row['op']}[{row['sample']}] {row['config']}: {row['outcome']}: {row['reason']}"
        )
    return "\n".join(lines)
