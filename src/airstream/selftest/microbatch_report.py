"""The report of ``airstream selftest microbatch``: each graph's outcome
(:class:`Outcome`), refusals and crashes sorted into classes, and the run summed up
(:func:`build_report`, :func:`format_report`)."""

from __future__ import annotations

import re
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airstream.selftest.microbatch_programs import MicrobatchProgram

__all__ = ["KINDS", "Outcome", "build_report", "crash_class", "format_report", "reason_class"]

# the worst first: where ranks differ, a program's outcome is the worst of theirs
KINDS = ("crash", "mismatch", "invalid", "baseline", "split", "refused", "left_alone")


@dataclass(frozen=True)
class Outcome:
    """``kind``: split (results equal), refused (``detail``: the reason class), left_alone (no
    warning), mismatch (``detail``: where; ``error``: the largest relative error), crash (during
    compile or run: ``detail``: the exception), baseline (it fails without the pass too) or
    invalid (eager PyTorch fails: a bug of the drawer); ``compiles``: the frames Dynamo compiled
    with the pass (more than one: the program recompiled at another token count, or broke)."""

    kind: str
    detail: str = ""
    error: float = 0.0
    compiles: int = 1


_NODE = re.compile(r"node '[^']*' \(([\w.]+)\)")


def reason_class(message: str) -> str:
    """A refusal's class: the last op it names and the phrase saying why (the clause after the
    op where there is one, else the one before it); else the message's first 80 characters."""
    failed = re.search(r"would fail at (?:node '[^']*' \(([\w.]+)\))?.*?\((\w+):", message)
    if failed:  # the pass's own check of its split graph
        return f"split graph would fail at {failed.group(1) or '?'} ({failed.group(2)})"
    text = message.removeprefix("microbatch_overlap left the graph unsplit: ")
    short = re.sub(r" at \S+:\d+ `[^`]*`| \(no source line recorded\)", "", text)
    short = short.split(". The pass splits")[0]
    hits = list(_NODE.finditer(short))
    if not hits:
        return text[:80]
    after = short[hits[-1].end() :].strip(" :.")
    before = short[: hits[-1].start()].rstrip(": ").rsplit(": ", 1)[-1].split(". ")[-1]
    phrase = after.rsplit(": ", 1)[-1] if after else before
    phrase = re.sub(r"^(it|The first,|, which) ", "", phrase)
    return f"{hits[-1].group(1)}: {phrase[:60]}"


def crash_class(exc: BaseException) -> str:
    """The innermost exception's type and first line, and the last airstream function it
    passed through (no line numbers: they move while the pass is edited)."""
    while True:
        inner = getattr(exc, "inner_exception", None) or exc.__cause__
        if inner is None or inner is exc:
            break
        exc = inner
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/airstream/" in f.filename]
    last = frames[-1] if frames else None
    where = f" in {last.filename.rsplit('/airstream/', 1)[1]}:{last.name}" if last else ""
    first = (str(exc).strip().splitlines() or [""])[0][:100]
    return f"{type(exc).__name__}: {first}{where}"


def build_report(
    programs: Sequence[MicrobatchProgram], outcomes: Sequence[Outcome], seed: int, mode: str,
    ranks: int, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    kinds = Counter(o.kind for o in outcomes)
    report: dict[str, Any] = {"tried": len(outcomes), "seed": seed, "mode": mode, "ranks": ranks}
    report.update({k: kinds[k] for k in ("split", "left_alone")}, seconds=round(seconds, 1))
    refused = Counter(o.detail for o in outcomes if o.kind == "refused")
    report["refused"] = dict(refused.most_common())
    for kind, key in (("mismatch", "mismatched"), ("crash", "crashed"), ("baseline", "baseline"),
                      ("invalid", "invalid")):  # fmt: skip
        hits = [(p, o) for p, o in zip(programs, outcomes, strict=True) if o.kind == kind]
        report[key] = [{"program": str(p), "error": o.detail} for p, o in hits[:20]]
        report[f"{key}_count"] = len(hits)
        classes = Counter(re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", o.detail) for _, o in hits)
        report[f"{key}_classes"] = dict(classes.most_common())
    dynamic = [o for p, o in zip(programs, outcomes, strict=True) if p.dynamic]
    report["dynamic"], report["recompiled"] = len(dynamic), sum(o.compiles > 1 for o in dynamic)
    failed = [(p, o) for p, o in zip(programs, outcomes, strict=True) if "would fail" in o.detail]
    report["self_check_failed"] = [{"program": str(p), "error": o.detail} for p, o in failed[:20]]
    splittable = [o for p, o in zip(programs, outcomes, strict=True) if p.splittable]
    report["splittable"] = len(splittable)
    report["split_of_splittable"] = sum(o.kind == "split" for o in splittable)
    missed = [(p, o) for p, o in zip(programs, outcomes, strict=True)
              if p.splittable and o.kind in ("refused", "left_alone")]  # fmt: skip
    report["missed"] = [{"program": str(p), "error": o.detail or o.kind} for p, o in missed[:20]]
    return report


def format_report(report: dict[str, Any]) -> str:
    """One paragraph: the outcome counts, the top refusal reasons and the seconds taken."""
    reasons = report["refused"]
    top = ", ".join(f"{r} x{n}" for r, n in list(reasons.items())[:3])
    checks = sum(n for r, n in reasons.items() if r.startswith("split graph would fail"))
    refused = f"{sum(reasons.values())} refused" + f" (top reasons: {top})" * bool(top)
    refused += f", {checks} of them by the pass's own check of its split graph" * bool(checks)
    extra = "".join(
        f", {report[f'{k}_count']} {k}" for k in ("baseline", "invalid") if report[f"{k}_count"]
    )
    share = report["split_of_splittable"] / max(report["splittable"], 1)
    return (
        f"microbatch fuzz: {report['tried']} graphs (seed {report['seed']}, {report['mode']}, "
        f"{report['ranks']} rank{'s' * (report['ranks'] > 1)}): {report['split']} split, "
        f"{refused}; {report['left_alone']} left alone, {report['mismatched_count']} mismatched, "
        f"{report['crashed_count']} crashed{extra}; {report['splittable']} contain a splittable "
        f"stretch, {report['split_of_splittable']} of them split ({share:.0%}); "
        f"{report['recompiled']} of {report['dynamic']} dynamic graphs recompiled; "
        f"{report['seconds']:.0f} s"
    )
