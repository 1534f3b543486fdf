"""One run of the GPU check: the steps in their order (a dry run's later steps side by side), their
skips, the report written as each finishes, and the verdict a reader can trust."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from gpu_check import checks, environment, processes, steps


class Run:
    """One run of the steps: their skips, the report, the verdict."""

    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args, self.out, self.dry = args, out, args.dry_run
        self.start = time.monotonic()
        self.budget = steps.BUDGET_S * (steps.DRY_SCALE if self.dry else 1)
        self.problems: dict[str, str] = {}  # environment problems: piece -> detail
        self.test_tools_missing: list[str] = []
        self.report: dict[str, Any] = {"verdict": "running", "machine": {}, "steps": []}

    def skip(self, name: str) -> dict[str, Any] | None:
        """The step's skip (or failure without running) record, or None where it runs."""
        args = self.args
        if name == "install":
            why = None
            if args.no_install:
                why = "--no-install"
            elif environment.externally_managed():
                why = f"{processes.PEP668} ({environment.externally_managed()})"
            elif environment.build_problem():
                problem = environment.build_problem()
                why = f"needs a build tool: {problem}; the steps run airstream from src/"
            if why:
                return {"step": name, "status": "skipped", "reason": why, "excused": True}
        missing = environment.missing_packages(name)
        if missing:
            reason = f"needs {', '.join(missing)}, not installed here"
            record = {"step": name, "status": "skipped", "reason": reason, "missing": missing}
            return {**record, "excused": True}
        if name in ("cuda-tests", "cuda-sanitizer") and self.test_tools_missing:
            names = " and ".join(self.test_tools_missing)
            reason = f"{names} cannot be imported: no CUDA test ran (see test-tools)"
            return {"step": name, "status": "failed", "reason": reason, "environment": True}
        if self.dry and name in steps.DRY_SKIPS:
            return {
                "step": name,
                "status": "skipped",
                "reason": steps.DRY_SKIPS[name],
                "excused": True,
            }
        needs = (steps.DRY_NEEDS if self.dry else steps.NEEDS).get(name, ())
        lacking = [piece for piece in needs if piece in self.problems]
        if lacking:
            reason = f"environment lacks {', '.join(lacking)}"
            return {"step": name, "status": "skipped", "reason": reason, "environment": True}
        if self.budget - (time.monotonic() - self.start) < 5:
            spent = f"the time budget ({self.budget} s) was spent before its turn"
            return {"step": name, "status": "skipped", "reason": spent}
        return None

    def run(self, name: str, command: list[str], limit: int) -> dict[str, Any]:
        skipped = self.skip(name)
        if skipped:
            return skipped
        limit = int(min(limit, self.budget - (time.monotonic() - self.start)))
        if name == "test-tools":
            step = environment.test_tools(self.args.wheels, self.out, limit)
            self.test_tools_missing = step.get("missing", [])
            return step
        if name in ("cuda-tests", "cuda-sanitizer"):
            return self.run_tests(name, command, limit)
        step = processes.run_step(name, command, limit, self.out)
        if name == "preflight" and isinstance(step["result"], dict):
            self.problems = dict(step["result"].get("problems", {}))
        return step

    def run_tests(self, name: str, command: list[str], limit: int) -> dict[str, Any]:
        files = steps.cuda_test_files()
        notes = []
        if steps.NCCL_TEST_FILE not in files:
            why = "missing, or without the cuda mark"
            notes.append(f"{steps.NCCL_TEST_FILE} (the one-rank NCCL check) did not run: {why}")
        lacking = []
        if not self.dry and "NCCL" in self.problems and steps.NCCL_TEST_FILE in files:
            files.remove(steps.NCCL_TEST_FILE)
            lacking.append(f"{steps.NCCL_TEST_FILE}: skipped: environment lacks NCCL")
        step = processes.run_tests(name, command, files, limit, self.out, self.dry)
        if lacking:
            step.update(environment_skips=lacking)
        if notes:
            step["notes"] = notes
            if not self.dry and name == "cuda-tests":
                step["status"] = "failed"
                step["reason"] = "; ".join(filter(None, [step.get("reason"), *notes]))
        return step

    def done(self, step: dict[str, Any]) -> None:
        self.report["steps"].append(step)
        shown = step["status"] + (f": {step['reason']}" if step.get("reason") else "")
        if len(shown) > 110:
            shown = shown[:107] + "..."
        took = f"{step['seconds']} s of {step['limit']}" if "seconds" in step else ""
        print(f"gpu-check: {step['step']:<25} {took:<13} {shown}", flush=True)
        for record in step.get("files", []):
            counts = ", ".join(f"{n} {outcome}" for outcome, n in record.get("counts", {}).items())
            why = f": {record['reason']}" if record.get("reason") else ""
            took = f", {record['seconds']} s" if "seconds" in record else ""
            print(f"gpu-check:   {record['file']}: {record['status']}{why} ({counts}{took})")
        for test in step.get("tests", []):
            if test["outcome"] in ("failed", "error"):
                first = test.get("message", "").splitlines()[:1]
                print(f"gpu-check:     {test['outcome']}: {test['test']}: {''.join(first)}")
        for line in (step.get("sanitizer"), *step.get("environment_skips", ())):
            if line:
                print(f"gpu-check:   {line}")
        for note in step.get("notes", []):
            print(f"gpu-check:   note: {note}")
        self.write()

    def write(self) -> None:
        (self.out / "report.json").write_text(json.dumps(self.report, indent=2))

    def verdict(self) -> int:
        """Write the verdict, failures first; return the exit status."""
        ran = self.report["steps"]
        failures, excused = [], []
        env_problems = [
            (not self.dry, f"{piece}: {detail}") for piece, detail in self.problems.items()
        ]
        notes = [f"{step['step']}: {note}" for step in ran for note in step.get("notes", [])]
        for step in ran:
            if step.get("files_not_run"):
                unreached = ", ".join(step["files_not_run"])
                notes.append(f"{step['step']}: not reached within its limit: {unreached}")
            what = f"{step['step']}: {step['status']}: {step.get('reason', '')}".rstrip(": ")
            if step["status"] == "passed":
                continue
            if step.get("environment") or step["step"] == "test-tools":
                env_problems.append((step["status"] == "failed" or not self.dry, what))
            elif step["status"] == "skipped" and step.get("excused"):
                excused.append(what)
            else:
                failures.append(what)
            for test in step.get("tests", []):
                if test["outcome"] in ("failed", "error"):
                    message = test.get("message", "").splitlines()[:1]
                    failures.append(f"  {test['test']}: {test['outcome']}: {''.join(message)}")
        fatal = [what for is_fatal, what in env_problems if is_fatal]
        not_fatal = [f"{what} (dry run: reported, not fatal)" for f, what in env_problems if not f]
        environment_problems = fatal + not_fatal  # the fatal ones first
        if failures:
            verdict = "FAILED"
        elif fatal:
            verdict = "FAILED-ENVIRONMENT"
        else:
            verdict = "all passed"
        seconds = round(time.monotonic() - self.start, 1)
        ordered = {
            "verdict": verdict,
            "failures": failures,
            "environment_problems": environment_problems,
            "excused": excused,
            "notes": notes,
            "seconds": seconds,
            "budget_s": self.budget,
            "limits_s": sum(steps.limits(self.dry).values()),
        }
        self.report = {**ordered, "machine": self.report["machine"], "steps": ran}
        self.write()
        print(f"gpu-check: {verdict} in {seconds} s (budget {self.budget} s); {self.out}")
        for line in failures:
            print(f"gpu-check:   failed: {line.strip()}")
        for line in environment_problems:
            print(f"gpu-check:   environment: {line}")
        for line in excused:
            print(f"gpu-check:   excused: {line}")
        for line in notes:
            print(f"gpu-check:   note: {line}")
        return {"FAILED": 1, "FAILED-ENVIRONMENT": 3}.get(verdict, 0)


def main(argv: list[str], description: str = "") -> int:
    parser = argparse.ArgumentParser(
        prog="tools/gpu-check",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", nargs="?", help="folder for report.json, the logs and trace.json")
    parser.add_argument("--dry-run", action="store_true", help="run the plumbing on CPU, tiny")
    parser.add_argument(
        "--no-install", action="store_true", help="leave the environment as it is (no install)"
    )
    parser.add_argument(
        "--wheels",
        metavar="DIR",
        help="install missing test tools (pytest, hypothesis) from the wheel files in DIR, "
        "offline, into OUT/site",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="steps at once in a dry run (default: one per core; on a GPU always one)",
    )
    # the checks that run in a process of their own
    parser.add_argument("--preflight", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.preflight or args.trace or args.baseline:
        return checks.main(args)
    if not args.out:
        parser.error("give an output folder: tools/gpu-check [--dry-run] OUT")
    if args.wheels and not Path(args.wheels).is_dir():
        parser.error(f"--wheels {args.wheels}: no such folder")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # started with `&` by a script:
        # the steps would inherit SIGINT ignored, and a step at its limit could not finish
        signal.signal(signal.SIGINT, signal.default_int_handler)
    run = Run(args, out)
    planned = steps.planned(args.dry_run, out)
    run.report["machine"].update(dry_run=args.dry_run, python=sys.version.split()[0])
    # preflight, install and test-tools, one after another: what the other steps can rely on
    head = [step for step in planned if step[0] in ("preflight", "install", "test-tools")]
    rest = [step for step in planned if step not in head]
    for step in head:
        run.done(run.run(*step))
        if step[0] == "preflight":
            facts = run.report["steps"][-1].get("result") or {}
            run.report["machine"].update(
                {k: facts.get(k) for k in ("torch", "cuda", "gpus", "triton", "nccl")}
            )
            print(
                f"gpu-check: torch {facts.get('torch')}, CUDA {facts.get('cuda')}, "
                f"GPUs {facts.get('gpus')}, Triton {facts.get('triton')}"
            )
            if not args.dry_run and "CUDA" in run.problems:
                print("gpu-check: no CUDA GPU visible to torch (--dry-run on CPU)", file=sys.stderr)
                run.verdict()
                return 2
    missing = {
        name: environment.missing_packages(name)
        for name in steps.REQUIRES
        if environment.missing_packages(name)
    }
    run.report["machine"]["missing"] = missing
    for name, names in missing.items():
        print(f"gpu-check: not installed here: {', '.join(names)} (the {name} step is skipped)")
    # On a GPU one step at a time (the benchmarks time the GPU). A dry run times nothing: its
    # other steps run one per core, and report in their order.
    jobs = min(len(rest), args.jobs or os.cpu_count() or 1) if args.dry_run else 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        for future in [pool.submit(run.run, *step) for step in rest]:
            run.done(future.result())
    return run.verdict()
