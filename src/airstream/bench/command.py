"""``airstream bench NAME``: run the named benchmark with the command line's options."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["run_bench"]


_ON_DEVICE = ("moe", "decode", "branches-pointwise")

ROUNDS = 15  # interleaved rounds, the default of every timing benchmark
COMPILE_ROUNDS = 3  # fresh compiles per model and config (`bench compile`): each takes seconds


def _rounds(args: argparse.Namespace, default: int = ROUNDS) -> int:
    """``--rounds`` as given, else this benchmark's default."""
    return int(args.rounds) if args.rounds is not None else default


def _models(bench: str, given: str | None, known: Sequence[str]) -> tuple[str, ...] | None:
    """The models ``--models`` names (all of ``known`` if none); ``None``, after saying why on
    stderr, if it names one ``bench`` does not have."""
    chosen = tuple(given.split(",")) if given else tuple(known)
    unknown = [m for m in chosen if m not in known]
    if unknown:
        print(
            f"airstream bench {bench}: unknown model(s) {unknown}; choose from {', '.join(known)}",
            file=sys.stderr,
        )
        return None
    return chosen


def run_bench(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.name`` and print its report (text, or JSON with --json)."""
    import json

    import torch

    device = getattr(args, "device", "cpu")
    if device != "cpu":
        if args.name not in _ON_DEVICE or args.passes:
            print(
                f"airstream bench {args.name}: --device {device} is not supported; it runs on "
                f"cpu (--device applies to {', '.join(_ON_DEVICE)})",
                file=sys.stderr,
            )
            return 2
        if not device.startswith("cuda") or not torch.cuda.is_available():
            print(
                f"airstream bench: --device {device}: "
                + (
                    "no CUDA GPU is visible to torch (see `airstream doctor`)"
                    if device.startswith("cuda")
                    else "choose cpu or cuda[:N]"
                ),
                file=sys.stderr,
            )
            return 2

    if args.name == "overhead":
        from airstream.bench.overhead import format_overhead, run_overhead

        report = run_overhead(ops=args.ops, rounds=_rounds(args), calls=args.calls or 100)
        text = format_overhead(report)
    elif args.name == "batched-experts":
        from airstream.bench.batched import run_batched

        report = run_batched(
            tokens=args.tokens or 8,
            hidden=args.hidden or 1024,
            rounds=_rounds(args),
            calls=args.calls or 5,
        )
        fastest = min(report["ms"].values())
        text = (
            f"batched experts: E={report['experts']}, B={report['tokens']}, "
            f"H={report['hidden']}, {report['cores']} cores\n"
            + "\n".join(
                f"  {name:<36}{ms:>8.2f} ms {ms / fastest:>6.2f}x"
                for name, ms in report["ms"].items()
            )
        )
    elif args.name == "memory":
        from airstream.bench.memory import format_memory, run_memory

        report = run_memory(
            layers=args.layers or 8,
            hidden=args.hidden or 1024,
            batch=args.tokens or 4096,
            steps=args.calls or 3,
        )
        text = format_memory(report)
    elif args.name == "passes":
        from airstream.bench.suite import pass_timing

        report = pass_timing()
        text = f"stream passes on a {report['nodes']}-node graph:\n" + "\n".join(
            f"  {name:<24}{seconds:.3f} s" for name, seconds in report["seconds"].items()
        )
    elif args.name == "compile":
        from airstream.bench.compile_time import format_compile, run_compile
        from airstream.selftest.architectures import ARCHS

        models = _models("compile", args.models, tuple(ARCHS))
        if models is None:
            return 2
        report = run_compile(models, rounds=_rounds(args, COMPILE_ROUNDS))
        text = format_compile(report)
    elif args.name == "restart":
        from airstream.bench.decode import DECODE_MODELS
        from airstream.bench.restart import format_restart, run_restart

        models = _models("restart", args.models, tuple(DECODE_MODELS))
        if models is None:
            return 2
        report = run_restart(models[0] if args.models else "qwen2-moe", rounds=_rounds(args, 1))
        text = format_restart(report)
    elif args.name == "tp":
        from airstream.bench.tp import format_tp, run_tp

        report = run_tp(
            nproc=args.nproc,
            layers=args.layers or 4,
            tokens=args.tokens or 64,
            hidden=args.hidden or 256,
            rounds=_rounds(args),
            calls=args.calls or 10,
        )
        text = format_tp(report)
    elif args.name == "serving-loop":
        from airstream.bench.serving import SERVING_MODELS, format_serving, run_serving

        chosen = _models("serving-loop", args.models, SERVING_MODELS)
        if chosen is None:
            return 2
        report = run_serving(
            chosen,
            batch=args.tokens or 8,
            hidden=args.hidden or 1024,
            rounds=_rounds(args),
            calls=args.calls or 5,
        )
        text = format_serving(report)
    elif args.name == "decode":
        from airstream.bench.decode import DECODE_MODELS, format_decode, run_decode

        models = _models("decode", args.models, tuple(DECODE_MODELS))
        if models is None:
            return 2
        report = run_decode(
            models,
            batch=args.tokens or 4,
            rounds=_rounds(args),
            calls=args.calls or 3,
            inductor=not args.no_inductor,
            device=device,
        )
        text = format_decode(report)
    elif args.mode is not None or args.name == "branches-pointwise":
        from airstream.bench.modes import MODES, format_modes, run_modes

        report = run_modes(
            args.name,
            modes=MODES if args.mode in (None, "both") else (args.mode,),
            tokens=args.tokens or 8,
            hidden=args.hidden or 1024,
            rounds=_rounds(args),
            calls=args.calls or 20,
            inductor=not args.no_inductor,
            compile_times=not args.no_compile_time,
            device=device,
        )
        text = format_modes(report)
    elif args.name != "moe" or args.passes:
        from airstream.bench.suite import format_suite, run_suite

        report = run_suite(
            args.name,
            tokens=args.tokens or 8,
            hidden=args.hidden or 1024,
            rounds=_rounds(args),
            calls=args.calls or 5,
            inductor=not args.no_inductor,
        )
        text = format_suite(report)
    else:
        from airstream.bench.moe import format_moe, run_moe

        report = run_moe(
            experts=args.experts,
            tokens=args.tokens or 8,
            hidden=args.hidden or 1024,
            rounds=_rounds(args),
            calls=args.calls or 5,
            inductor=not args.no_inductor,
            device=device,
        )
        text = format_moe(report)
    print(json.dumps(report, indent=2) if args.json else text)
    return 0
