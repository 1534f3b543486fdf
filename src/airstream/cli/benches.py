"""``airstream bench NAME``: every benchmark as one row of a table, its summary, the defaults of
its options and how it runs; the parser's help text is made from the same table.

Each runner imports its benchmark module when it runs (``import airstream`` and the parser must
not pay for them: tests/test_layers.py).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BENCHES", "OPTIONS", "Bench", "default_help", "run_bench"]

Report = tuple[dict[str, Any], str]  # the figures (JSON-able) and their text


@dataclass(frozen=True)
class Bench:
    """One benchmark: ``summary`` for the help; ``run(args)`` with every option resolved;
    ``defaults``: its own default of an option (else :data:`OPTIONS`'); ``on_device``: takes
    ``--device cuda``; ``modes``: ``--mode`` times the airstream modes, with these defaults."""

    summary: str
    run: Callable[[argparse.Namespace], Report]
    defaults: Mapping[str, int] = field(default_factory=dict)
    on_device: bool = False
    modes: Mapping[str, int] | None = None


# The numeric options every benchmark may read, with their default where it sets none.
OPTIONS: Mapping[str, int] = {"rounds": 15, "calls": 5, "tokens": 8, "hidden": 1024, "layers": 4}


# decode --alone: a fresh process per runner and round (tens of seconds each)
ALONE: Mapping[str, int] = {"rounds": 5, "calls": 6}


def _call(module: str, name: str, **options: str) -> Callable[[argparse.Namespace], Report]:
    """A runner of ``airstream.bench.<module>``: ``run_<name>`` called with each keyword's option
    (``options``: keyword -> option name), its report as ``format_<name>`` writes it."""

    def run(a: argparse.Namespace) -> Report:
        bench = importlib.import_module(f"airstream.bench.{module}")
        report = getattr(bench, f"run_{name}")(**{k: getattr(a, o) for k, o in options.items()})
        return report, getattr(bench, f"format_{name}")(report)

    return run


_TIMED = {"rounds": "rounds", "calls": "calls"}


def _models(bench: str, given: str | None, known: Sequence[str]) -> tuple[str, ...]:
    """The models ``--models`` names (all of ``known`` if none); SystemExit(2), after saying why
    on stderr, if it names one ``bench`` does not have."""
    chosen = tuple(given.split(",")) if given else tuple(known)
    unknown = [m for m in chosen if m not in known]
    if unknown:
        print(
            f"airstream bench {bench}: unknown model(s) {unknown}; choose from {', '.join(known)}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    return chosen


def _batched(a: argparse.Namespace) -> Report:
    from airstream.bench.batched import run_batched

    report = run_batched(tokens=a.tokens, hidden=a.hidden, rounds=a.rounds, calls=a.calls)
    fastest = min(report["ms"].values())
    text = (
        f"batched experts: E={report['experts']}, B={report['tokens']}, "
        f"H={report['hidden']}, {report['cores']} cores\n"
        + "\n".join(
            f"  {name:<36}{ms:>8.2f} ms {ms / fastest:>6.2f}x" for name, ms in report["ms"].items()
        )
    )
    return report, text


def _passes(a: argparse.Namespace) -> Report:
    from airstream.bench.suite import pass_timing

    report = pass_timing()
    text = f"stream passes on a {report['nodes']}-node graph:\n" + "\n".join(
        f"  {name:<24}{seconds:.3f} s" for name, seconds in report["seconds"].items()
    )
    return report, text


def _compile(a: argparse.Namespace) -> Report:
    from airstream.bench.compile_time import format_compile, run_compile
    from airstream.selftest.architectures import ARCHS

    report = run_compile(_models("compile", a.models, tuple(ARCHS)), rounds=a.rounds)
    return report, format_compile(report)


def _restart(a: argparse.Namespace) -> Report:
    from airstream.bench.decode import DECODE_MODELS
    from airstream.bench.restart import RESTART_CASES, format_restart, run_restart

    models = _models("restart", a.models, tuple(DECODE_MODELS))
    cases = tuple(c.strip() for c in a.cases.split(",") if c.strip()) or RESTART_CASES
    unknown = [c for c in cases if c not in RESTART_CASES]
    if unknown:
        print(
            f"airstream bench restart: unknown case(s) {unknown}; choose from "
            + ", ".join(RESTART_CASES),
            file=sys.stderr,
        )
        raise SystemExit(2)
    report = run_restart(models[0] if a.models else "qwen2-moe", cases=cases, rounds=a.rounds)
    return report, format_restart(report)


def _microbatch(a: argparse.Namespace) -> Report:
    from airstream.bench.microbatch import (
        MICROBATCH_MODELS,
        SIZES,
        format_microbatch,
        run_microbatch,
    )

    models = _models("microbatch", a.models, MICROBATCH_MODELS)
    sizes = tuple(int(t) for t in a.sizes.split(",")) if a.sizes else SIZES
    report = run_microbatch(
        nproc=a.nproc,
        models=models,
        sizes=sizes,
        layers=a.layers,
        hidden=a.hidden,
        rounds=a.rounds,
        calls=a.calls,
        comm=a.comm,
        alpha_us=a.alpha_us,
        beta_ns_per_byte=a.beta_ns,
    )
    return report, format_microbatch(report)


def _serving(a: argparse.Namespace) -> Report:
    from airstream.bench.serving import SERVING_MODELS, format_serving, run_serving

    report = run_serving(
        _models("serving-loop", a.models, SERVING_MODELS),
        batch=a.tokens,
        hidden=a.hidden,
        rounds=a.rounds,
        calls=a.calls,
    )
    return report, format_serving(report)


def _decode(a: argparse.Namespace) -> Report:
    from airstream.bench.decode import DECODE_MODELS, format_decode, run_decode

    if a.alone:
        from airstream.bench.decode_alone import format_alone, run_alone

        modes = ("reduce-overhead", "max-autotune") if a.mode in (None, "both") else (a.mode,)
        models = _models("decode", a.models, tuple(DECODE_MODELS))
        alone = run_alone(models, modes, rounds=a.rounds, steps=a.calls * 5, batch=a.tokens)
        return alone, format_alone(alone)

    report = run_decode(
        _models("decode", a.models, tuple(DECODE_MODELS)),
        batch=a.tokens,
        rounds=a.rounds,
        calls=a.calls,
        inductor=not a.no_inductor,
        device=a.device,
    )
    return report, format_decode(report)


def _suite_models(a: argparse.Namespace) -> Report:
    from airstream.bench.suite_models import format_suite_models, run_suite_models
    from airstream.selftest.architectures import ARCHS

    models = _models("suite-models", a.models, tuple(ARCHS))
    report = run_suite_models(models, rounds=a.rounds, calls=a.calls)
    return report, format_suite_models(report)


def _train(a: argparse.Namespace) -> Report:
    from airstream.bench.train import TRAIN_MODELS, format_train, run_train

    report = run_train(
        _models("train", a.models, TRAIN_MODELS),
        batch=a.tokens,
        rounds=a.rounds,
        calls=a.calls,
        inductor=not a.no_inductor,
    )
    return report, format_train(report)


def _modes(a: argparse.Namespace) -> Report:
    from airstream.bench.modes import MODES, format_modes, run_modes

    report = run_modes(
        a.name,
        modes=MODES if a.mode in (None, "both") else (a.mode,),
        tokens=a.tokens,
        hidden=a.hidden,
        rounds=a.rounds,
        calls=a.calls,
        inductor=not a.no_inductor,
        compile_times=not a.no_compile_time,
        device=a.device,
    )
    return report, format_modes(report)


def _suite(a: argparse.Namespace) -> Report:
    from airstream.bench.suite import format_suite, run_suite

    report = run_suite(
        a.name,
        tokens=a.tokens,
        hidden=a.hidden,
        rounds=a.rounds,
        calls=a.calls,
        inductor=not a.no_inductor,
    )
    return report, format_suite(report)


def _moe(a: argparse.Namespace) -> Report:
    if a.passes:  # the stream passes on the same block
        return _suite(a)
    from airstream.bench.moe import format_moe, run_moe

    report = run_moe(
        experts=a.experts,
        tokens=a.tokens,
        hidden=a.hidden,
        rounds=a.rounds,
        calls=a.calls,
        inductor=not a.no_inductor,
        device=a.device,
    )
    return report, format_moe(report)


BENCHES: Mapping[str, Bench] = {
    "overhead": Bench(
        "per-op cost against fx.GraphModule; what one side stream costs",
        _call("overhead", "overhead", ops="ops", **_TIMED),
        {"calls": 100},
    ),
    "moe": Bench(
        "a dense MoE block: eager, Inductor, airstream on 1 and 2 streams",
        _moe,
        on_device=True,
        modes={"calls": 20},
    ),
    "moe-shared": Bench("a MoE block with a shared expert and the stream passes for it", _suite),
    "branches": Bench("parallel branches and the stream passes that apply to them", _suite),
    "mlp": Bench("an MLP stack and the stream passes that apply to it", _suite),
    "passes": Bench("how long each stream pass takes on a 5,000-node graph", _passes),
    "compile": Bench(
        "how long airstream takes to compile each model of the model suite (--models)",
        _compile,
        {"rounds": 3},
    ),
    "batched-experts": Bench(
        "experts as one batched op, or split per expert on 2 streams", _batched
    ),
    "branches-pointwise": Bench(
        "reduce-overhead vs max-autotune, 1 and 2 streams, compile times",
        _modes,
        {"calls": 20},
        on_device=True,
        modes={"calls": 20},
    ),
    "kernel-split": Bench(
        "fused pointwise chains on 2 streams at 1 thread each: Inductor kernels side by side",
        _call("kernel_split", "kernel_split", tokens="tokens", hidden="hidden", **_TIMED),
        {"tokens": 256},
    ),
    "tp": Bench(
        "a tensor-parallel MLP on --nproc ranks, with overlap_communication",
        _call(
            "tp", "tp", nproc="nproc", layers="layers", tokens="tokens", hidden="hidden", **_TIMED
        ),
        {"tokens": 64, "hidden": 256, "calls": 10},
    ),
    "microbatch": Bench(
        "microbatch_overlap on --nproc gloo ranks (--comm modelled: modelled delays) against "
        "the unsplit graph and a hand-written split, over --sizes tokens",
        _microbatch,
        {"hidden": 256, "layers": 4, "rounds": 5, "calls": 2},
    ),
    "memory": Bench(
        "peak memory of a training step and of inference",
        _call("memory", "memory", layers="layers", hidden="hidden", batch="tokens", steps="calls"),
        {"tokens": 4096, "layers": 8, "calls": 3},
    ),
    "decode": Bench(
        "decode steps of transformers models (--models): tokens/s",
        _decode,
        {"tokens": 4, "calls": 3},
        on_device=True,
    ),
    "suite-models": Bench(
        "auto_streams against one stream on every model suite architecture (--models)",
        _suite_models,
        {"rounds": 7, "calls": 50},
    ),
    "threads": Bench(
        "moe's 2-stream split measured with other threads per stream, beside its steady state",
        _call("threads", "threads", experts="experts", tokens="tokens", hidden="hidden", **_TIMED),
    ),
    "train": Bench(
        "training steps of the decode models (--models): auto_streams measured per graph",
        _train,
        {"tokens": 2, "calls": 3},
    ),
    "serving-loop": Bench("models called alone and between eager sampling work", _serving),
    "vllm": Bench(
        "a tiny Qwen2-MoE served by vLLM's CPU build: Inductor, one stream, streams (--tokens:"
        " decode steps per measure)",
        _call("vllm", "vllm", rounds="rounds", steps="tokens", hidden="hidden", layers="layers"),
        {"rounds": 5, "hidden": 256, "layers": 2},
    ),
    "restart": Bench(
        "a new process's first call, cold and warm caches: torch.compile, cache_compile",
        _restart,
        {"rounds": 1},
    ),
}


def default_help(option: str) -> str:
    """``option``'s defaults in words: the common one, then each benchmark's own."""
    common = OPTIONS[option]
    own = [f"{name} {b.defaults[option]}" for name, b in BENCHES.items() if option in b.defaults]
    modes = {b.modes[option] for b in BENCHES.values() if b.modes and option in b.modes}
    own += [f"--mode {m}" for m in sorted(modes)]
    return f"default {common}" + (f"; {', '.join(own)}" if own else "")


def _device_problem(name: str, bench: Bench, args: argparse.Namespace) -> str | None:
    """Why ``--device`` cannot be used here, or None."""
    device = args.device
    if device == "cpu":
        return None
    if not bench.on_device or args.passes:
        on = ", ".join(n for n, b in BENCHES.items() if b.on_device)
        return f"--device {device} is not supported; it runs on cpu (--device applies to {on})"
    import torch

    if not device.startswith("cuda"):
        return f"--device {device}: choose cpu or cuda[:N]"
    if not torch.cuda.is_available():
        return f"--device {device}: no CUDA GPU is visible to torch (see `airstream doctor`)"
    return None


def run_bench(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.name`` and print its report (text, or JSON with --json)."""
    bench = BENCHES[args.name]
    problem = _device_problem(args.name, bench, args)
    alone = bool(getattr(args, "alone", False))
    if alone and args.name != "decode":
        problem = "--alone applies to decode"
    elif args.mode is not None and bench.modes is None and not alone:
        on = ", ".join(n for n, b in BENCHES.items() if b.modes is not None)
        problem = f"--mode applies to {on} (and decode --alone)"
    if problem is not None:
        print(f"airstream bench {args.name}: {problem}", file=sys.stderr)
        return 2
    modes = bench.modes if args.mode is not None and not alone else None
    timing_modes = modes is not None
    defaults = {**OPTIONS, **bench.defaults, **(modes or {}), **(ALONE if alone else {})}
    resolved = argparse.Namespace(**vars(args))
    for option, value in defaults.items():
        if getattr(resolved, option, None) is None:
            setattr(resolved, option, value)
    try:
        report, text = (_modes if timing_modes else bench.run)(resolved)
    except SystemExit as stop:  # a --models name it does not have (said on stderr)
        return int(stop.code or 2)
    print(json.dumps(report, indent=2) if args.json else text)
    return 0
