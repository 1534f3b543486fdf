"""The "never slower" line a benchmark prints: each airstream configuration against the better of
eager and Inductor (the backends a torch.compile user already has) and, where the benchmark has
one, against the machine's ceiling for its split (the better of eager and the same split on
hand-written threads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["GOAL", "never_slower", "never_slower_line"]

GOAL = 0.97  # issue 30: airstream's default at least 0.97x the better of eager and Inductor


def never_slower(
    times: Mapping[str, float],
    configs: Sequence[str],
    baselines: Sequence[str],
    ceiling: Sequence[str] = (),
) -> dict[str, Any]:
    """Per configuration (a runner of ``times``, lower is better): its speed as a fraction of
    the best of ``baselines`` (``vs_best``: 1.0 = as fast) and of the best of ``ceiling``
    (``vs_ceiling``, when given), and whether it meets :data:`GOAL` against the baselines."""
    best = min(times[b] for b in baselines if b in times)
    top = min((times[c] for c in ceiling if c in times), default=None)
    out: dict[str, Any] = {
        "baseline": min((b for b in baselines if b in times), key=times.__getitem__),
        "goal": GOAL,
        "configs": {},
    }
    if top is not None:
        out["ceiling"] = min((c for c in ceiling if c in times), key=times.__getitem__)
    for name in configs:
        if name not in times:
            continue
        entry = {"vs_best": best / times[name], "met": best / times[name] >= GOAL}
        if top is not None:
            entry["vs_ceiling"] = top / times[name]
        out["configs"][name] = entry
    return out


def never_slower_line(verdict: Mapping[str, Any], conditions: str) -> str:
    """The verdict as one line (and the conditions it holds under)."""
    parts = []
    for name, entry in verdict["configs"].items():
        text = f"{name} {entry['vs_best']:.2f}x"
        if "vs_ceiling" in entry:
            text += f" ({entry['vs_ceiling']:.2f}x of the ceiling)"
        parts.append(text + ("" if entry["met"] else " SLOWER"))
    ceiling = f"; ceiling: {verdict['ceiling']}" if "ceiling" in verdict else ""
    return (
        f"never slower (goal >= {verdict['goal']:.2f}x of the best of eager and Inductor, here "
        f"{verdict['baseline']}{ceiling}; {conditions}): " + ", ".join(parts)
    )
