"""``airstream selftest``: run a self-test suite (fuzz, models, opinfo) and print its report."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["run_selftest"]


def run_selftest(args: argparse.Namespace) -> int:
    """Run the suite ``args.suite`` names; print its report (``--json``: as JSON)."""
    if args.suite == "fuzz":
        return _fuzz(args)
    if args.suite == "microbatch":
        return _microbatch(args)
    if args.suite == "models":
        return _models(args)
    return _opinfo(args)


def _fuzz(args: argparse.Namespace) -> int:
    """Random stream programs through the runtimes; one line (or JSON) saying how they did."""
    import time

    from airstream.selftest.fuzz import run_fuzz

    # the default mode on CPU is max-autotune; without --mode the fuzzer runs the aten path
    mode = {None: "reduce-overhead", "default": "max-autotune"}.get(args.mode, args.mode)
    start = time.perf_counter()
    report = run_fuzz(args.cases, seed=args.seed, runs=args.runs, mode=mode)
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["seed"] = args.seed
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        compared = (
            f"with {report['segments']} Inductor segments against the aten path"
            if mode == "max-autotune"
            else "through the CPU runtime and the serial executor"
        )
        print(
            f"fuzz: {report['valid']} valid programs ({report['side_stream_programs']} with "
            f"side streams), each run {args.runs}x {compared}: all equal, no hang; "
            f"{report['invalid']} broken programs: all "
            f"StreamError {report['invalid_kinds']}; seed {args.seed}, "
            f"{report['seconds']} s"
        )
    return 0


def _microbatch(args: argparse.Namespace) -> int:
    """microbatch_overlap's differential fuzzer: one line per graph on stderr, then the report
    (or JSON). Exit status 1 where a graph mismatched or crashed."""
    from airstream.selftest.microbatch_fuzz import run_microbatch_fuzz
    from airstream.selftest.microbatch_report import format_report

    mode = {None: "reduce-overhead", "default": "max-autotune"}.get(args.mode, args.mode)

    def show(index: int, program: object, outcome: object) -> None:
        kind = getattr(outcome, "kind", "")
        detail = getattr(outcome, "detail", "")
        print(f"  {index:5d} {kind:10s} {detail}"[:160], file=sys.stderr, flush=True)

    report = run_microbatch_fuzz(
        args.graphs,
        seed=args.seed,
        mode=mode,
        ranks=args.ranks,
        progress=None if args.json else show,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report.get("mismatched_count") or report.get("crashed_count") else 0


def _models(args: argparse.Namespace) -> int:
    """transformers architectures through every configuration; progress on stderr, then the
    table (or JSON). Exit status 1 when one failed."""
    import dataclasses

    from airstream.selftest.models import format_table, run_suite

    def show(result: object) -> None:
        status = getattr(result, "status", "")
        if status != "n/a":
            name = f"{getattr(result, 'arch', '')} {getattr(result, 'config', '')}"
            print(f"  {name}: {status}", file=sys.stderr, flush=True)

    try:
        results = run_suite(
            archs=args.archs.split(",") if args.archs else None,
            configs=args.configs.split(",") if args.configs else None,
            progress=None if args.json else show,
            mode=args.mode or "default",
        )
    except ValueError as error:
        print(f"airstream selftest models: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        print(format_table(results))
    return 0 if all(r.status != "FAIL" for r in results) else 1


def _opinfo(args: argparse.Namespace) -> int:
    """The OpInfo sweep (or the report of saved --results files, --load)."""
    from airstream.selftest.opinfo import format_sweep, load_sweep, run_sweep

    if args.load:
        sweep = load_sweep(args.load.split(","), args.max_samples)
    else:
        shard = tuple(int(x) for x in args.shard.split("/"))
        sweep = run_sweep(
            ops=args.ops.split(",") if args.ops else None,
            max_samples=args.max_samples,
            inductor=not args.no_inductor,
            progress=True,
            configs=args.configs.split(",") if args.configs else None,
            shard=(shard[0], shard[1]),
            results_path=args.results,
        )
    print(json.dumps(sweep, indent=2) if args.json else format_sweep(sweep))
    return 0
