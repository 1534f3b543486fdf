"""The commands that hand their arguments to one module: demo, explain, doctor, bench."""

from __future__ import annotations

import argparse
import sys

__all__ = ["bench", "demo", "doctor", "explain"]


def demo(args: argparse.Namespace) -> int:
    """``airstream demo``: the TorchAir guide's example, compiled and explained."""
    from airstream.cli.demo import run_demo

    text, ok = run_demo(size=args.size, seed=args.seed, out_dir=args.out or None)
    print(text, end="")
    return 0 if ok else 1


def bench(args: argparse.Namespace) -> int:
    """``airstream bench``: one benchmark (airstream.cli.benches)."""
    from airstream.cli.benches import run_bench

    return run_bench(args)


def explain(args: argparse.Namespace) -> int:
    """``airstream explain``: compile the model of a module:factory target and report it."""
    import importlib

    from airstream.cli.explain import explain as explain_model
    from airstream.options.config import CompilerConfig

    module_name, _, attr = args.target.partition(":")
    if not attr:
        print(f"airstream explain: expected module:factory, got {args.target!r}", file=sys.stderr)
        return 2
    sys.path.insert(0, ".")
    factory = getattr(importlib.import_module(module_name), attr)
    made = factory()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        print(
            f"airstream explain: {args.target}() must return (model, inputs) or "
            f"(model, inputs, compiler_config), got {type(made).__name__}",
            file=sys.stderr,
        )
        return 2
    model, inputs = made[0], made[1]
    config = made[2] if len(made) == 3 else CompilerConfig()
    if args.dump:
        config.debug.graph_dump.type = args.dump
        config.debug.graph_dump.path = args.dump_path
    inputs = inputs if isinstance(inputs, (list, tuple)) else (inputs,)
    print(explain_model(model, *inputs, compiler_config=config))
    return 0


def doctor(args: argparse.Namespace) -> int:
    """``airstream doctor``: what a bug report needs (airstream.cli.doctor)."""
    import json

    from airstream.cli.doctor import collect, format_report

    report = collect(recalibrate=args.recalibrate)
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_report(report), end="")
    return 0 if report.healthy else 1


def cache(args: argparse.Namespace) -> int:
    """``airstream cache``: the compile cache's entries, or --clear them."""
    import time
    from pathlib import Path

    from airstream.caching.cache_files import clear_entries, default_root, list_entries
    from airstream.compiler.decisions import clear_decisions, decisions_root, list_decisions

    root = Path(args.dir) if args.dir else default_root()
    decided = None if args.dir else decisions_root()  # --dir: another program's cache
    if args.clear:
        count, size = clear_entries(root)
        print(
            f"removed {count} entr{'y' if count == 1 else 'ies'} ({size / 1e6:.1f} MB) from {root}"
        )
        if decided is not None:
            removed, size = clear_decisions(decided)
            print(f"removed the measured decisions of {removed} graph(s) ({size} bytes)")
        return 0
    entries = list_entries(root)
    print(f"compile cache: {root}")
    now = time.time()
    for entry in entries:
        age = (now - entry.modified) / 3600
        print(f"  {entry.function}\n    {entry.bytes / 1e6:.1f} MB, {age:.1f} h old: {entry.path}")
    total = sum(e.bytes for e in entries)
    print(f"  {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}, {total / 1e6:.1f} MB")
    if decided is not None:
        graphs = list_decisions(decided)
        print(f"measured stream decisions (measure_placement): {decided}")
        for graph in graphs:
            age = (now - graph.modified) / 3600
            print(f"  {graph.graph}, {age:.1f} h old: {graph.directory.name}")
            for decision in graph.decisions:
                print(f"    {decision.describe()}")
        print(f"  {len(graphs)} graph(s)")
    return 0
