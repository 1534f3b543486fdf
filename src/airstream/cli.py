"""The ``airstream`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _demo(args: argparse.Namespace) -> int:
    from airstream.demo import run_demo

    text, ok = run_demo(size=args.size, seed=args.seed)
    print(text, end="")
    return 0 if ok else 1


def _bench(args: argparse.Namespace) -> int:
    import json

    from airstream.bench.overhead import format_overhead, run_overhead

    report = run_overhead(ops=args.ops, rounds=args.rounds, calls=args.calls)
    print(json.dumps(report, indent=2) if args.json else format_overhead(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``airstream`` command."""
    parser = argparse.ArgumentParser(
        prog="airstream",
        description="airstream: custom FX passes and multi-stream execution for torch.compile",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="run the TorchAir guide's multi-stream example and explain it"
    )
    demo.add_argument("--size", type=int, default=64, help="side of the square input (default 64)")
    demo.add_argument("--seed", type=int, default=0, help="random seed of the input")
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="run a benchmark and print its figures")
    bench.add_argument("name", choices=["overhead"], help="overhead: per-op cost vs fx.GraphModule")
    bench.add_argument("--ops", type=int, default=200, help="ops in the chain (default 200)")
    bench.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    bench.add_argument("--calls", type=int, default=100, help="calls per round (default 100)")
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``airstream`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
