"""The argument parsers of the ``airstream`` command, declared as one table (:data:`COMMANDS`):
each subcommand's summary, --help text, examples, arguments and the function it runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airstream.cli import commands
from airstream.cli.benches import BENCHES, default_help
from airstream.cli.run import run_script
from airstream.cli.selftest import run_selftest

__all__ = ["COMMANDS", "Arg", "Command", "build_parser"]


@dataclass(frozen=True)
class Arg:
    """One argument of a subcommand: its names (``"--size"``, or a positional's) and what
    ``argparse``'s ``add_argument`` takes besides them."""

    names: tuple[str, ...]
    help: str
    options: Mapping[str, Any] = field(default_factory=dict)


def arg(*names: str, help: str, **options: Any) -> Arg:
    """An :class:`Arg`, written as ``add_argument`` is called."""
    return Arg(names, help, options)


@dataclass(frozen=True)
class Command:
    """A subcommand: ``summary`` in the command list; its --help shows ``description`` (kept as
    written) and then ``examples``, one command a line; ``run(args)`` returns the exit status."""

    name: str
    summary: str
    description: str
    examples: tuple[str, ...]
    run: Callable[[argparse.Namespace], int]
    args: tuple[Arg, ...]


COMMANDS: tuple[Command, ...] = (
    Command(
        "demo",
        "run the TorchAir guide's multi-stream example and explain it",
        "Compile the TorchAir guide's example (mm and abs on a second stream, sub waiting for\n"
        "them) and print the graph before and after its custom pass, which stream each op ran\n"
        "on, and whether the result equals eager PyTorch. Dumps and a timeline go to --out.",
        (
            "airstream demo",
            "airstream demo --size 256 --out ''     # a bigger input, no files written",
        ),
        commands.demo,
        (
            arg("--size", type=int, default=64, help="side of the square input (default 64)"),
            arg("--seed", type=int, default=0, help="random seed of the input"),
            arg(
                "--out",
                default="airstream_demo",
                help="where to write the dumps and the timeline (default airstream_demo; '' for "
                "none)",
            ),
        ),
    ),
    Command(
        "explain",
        "compile a model without running it and report what airstream decided",
        "Compile a model without running it and print each graph after every pass, the stream\n"
        "each op was put on, and the plan of each stream with its waits and records. TARGET is\n"
        "module:factory, where factory() returns (model, inputs) or (model, inputs, config).",
        (
            "airstream explain airstream.examples.guide:explain_target",
            "airstream explain mymodel:build --dump svg    # also draw each graph",
        ),
        commands.explain,
        (
            arg(
                "target",
                help="module:factory; factory() returns (model, inputs) or (model, inputs, config)",
            ),
            arg("--dump", choices=["txt", "py", "dot", "svg"], help="also write dumps"),
            arg("--dump-path", default="airstream_dump", help="where dumps go"),
        ),
    ),
    Command(
        "selftest",
        "run the fuzzers, the OpInfo sweep or the transformers model suite",
        "Check airstream against references and print a report. SUITE is one of:\n"
        "  fuzz    random stream programs run through the runtimes and compared with a serial\n"
        "          run (--mode max-autotune: Inductor segments against aten); broken programs\n"
        "          must raise StreamError\n"
        "  microbatch  random graphs with collectives through microbatch_overlap, forced on a\n"
        "          gloo group of --ranks ranks, static and dynamic, inference and training,\n"
        "          against eager PyTorch: every graph split with equal results (and\n"
        "          gradients) or refused with a named op; exit status 1 on a mismatch or crash\n"
        "  opinfo  every op of torch's OpInfo database through airstream's configurations\n"
        "  models  transformers architectures (random weights) through every configuration,\n"
        "          compared with eager, aot_eager the referee (needs `pip install\n"
        "          transformers`); a configuration is a run (inference, training, two_lengths,\n"
        "          generate) with a placement (none, auto_streams, auto_forced: streams forced,\n"
        "          forced, shared_expert, moe_experts), named training/auto_forced; every case\n"
        "          compiles in --mode (default: mode='default', what users get)",
        (
            "airstream selftest fuzz --cases 10000 --seed 2026",
            "airstream selftest fuzz --mode max-autotune --cases 100",
            "airstream selftest microbatch --graphs 10000 --seed 0",
            "airstream selftest microbatch --graphs 200 --ranks 2",
            "airstream selftest opinfo --ops add,mm --no-inductor",
            "airstream selftest models --archs llama --json",
            "airstream selftest models --configs auto_forced,training/auto_forced",
        ),
        run_selftest,
        (
            arg(
                "suite",
                metavar="SUITE",
                choices=["fuzz", "microbatch", "opinfo", "models"],
                help="fuzz, microbatch, opinfo or models",
            ),
            arg("--cases", type=int, default=1000, help="fuzz: programs (default 1000)"),
            arg("--graphs", type=int, default=1000, help="microbatch: graphs (default 1000)"),
            arg(
                "--ranks",
                type=int,
                choices=[1, 2],
                default=1,
                help="microbatch: gloo ranks (1: in this process; 2: spawned on localhost)",
            ),
            arg("--seed", type=int, default=0, help="fuzz, microbatch: seed (default 0)"),
            arg("--runs", type=int, default=2, help="fuzz: runs per program"),
            arg(
                "--mode",
                choices=["default", "reduce-overhead", "max-autotune"],
                default=None,
                help="fuzz: max-autotune compiles each program's segments with Inductor and "
                "compares "
                "with the aten path (default reduce-overhead); microbatch: the mode every graph "
                "compiles in (default reduce-overhead; default: Inductor segments on CPU); "
                "models: the "
                "mode every case compiles in (default: default, what torch.compile users get)",
            ),
            arg("--ops", default="", help="opinfo: comma-separated op names (all)"),
            arg("--max-samples", type=int, default=None, help="opinfo: samples per op (all)"),
            arg(
                "--no-inductor",
                action="store_true",
                help="opinfo: skip the Inductor-based configurations (max-autotune and the "
                "Inductor "
                "anchor compile C++ per sample: hours for all ops)",
            ),
            arg(
                "--configs",
                default="",
                help="opinfo, models: comma-separated configurations (default: all; opinfo always "
                "adds "
                "aot_eager)",
            ),
            arg("--archs", default="", help="models: comma-separated architectures (default: all)"),
            arg(
                "--shard",
                default="0/1",
                help="opinfo: k/n sweeps every n-th op from the k-th (0/1)",
            ),
            arg(
                "--results",
                default=None,
                help="opinfo: append each op's results to this JSON-lines file",
            ),
            arg(
                "--load",
                default="",
                help="opinfo: comma-separated --results files to report on (e.g. one per shard); "
                "sweeps nothing",
            ),
            arg("--json", action="store_true", help="print the report as JSON"),
        ),
    ),
    Command(
        "doctor",
        "versions, torch support, CPU threads, OpenMP, CUDA, Graphviz, C++ compiler: what a "
        "bug report needs and what each optional part requires",
        "Print what a bug report needs: the versions of airstream, torch and Python, whether\n"
        "this torch is supported and has every private API airstream uses, the CPU's cores,\n"
        "threads and OpenMP runtime, the stream costs auto_streams decides with, and each\n"
        "optional part (CUDA, Triton, a C++ compiler for max-autotune, Graphviz,\n"
        "torch.distributed, the test tools) with what stops working without it and how to\n"
        "install it. Exit status 1 when airstream's core cannot work on this torch.",
        (
            "airstream doctor",
            "airstream doctor --json > doctor.json",
            "airstream doctor --recalibrate     # measure the stream costs again",
        ),
        commands.doctor,
        (
            arg("--json", action="store_true", help="print the report as JSON"),
            arg(
                "--recalibrate",
                action="store_true",
                help="measure the stream costs auto_streams decides with again (5-10 s) and cache "
                "them",
            ),
        ),
    ),
    Command(
        "cache",
        "list or clear the compile cache and the measured stream decisions kept on disk",
        "List the entries of the on-disk compile cache: each compiled function, its file, its\n"
        "size and age, and the total. The cache is airstream's cache directory's compiled/\n"
        "($AIRSTREAM_CACHE_DIR, else $XDG_CACHE_HOME/airstream, else ~/.cache/airstream);\n"
        "--dir reads another one, such as a TorchAir script's ./.torchair_cache. Then the\n"
        "stream decisions measure_placement measured (its decisions/ folder): each graph and,\n"
        "per size range, the candidate kept and its measured times. --clear deletes both (the\n"
        "next call compiles and measures again). Inductor keeps its own cache\n"
        "($TORCHINDUCTOR_CACHE_DIR), which this command leaves alone.",
        (
            "airstream cache",
            "airstream cache --clear",
            "airstream cache --dir .torchair_cache",
        ),
        commands.cache,
        (
            arg("--dir", help="the cache directory to read (default: airstream's)"),
            arg("--clear", action="store_true", help="delete every entry"),
        ),
    ),
    Command(
        "run",
        "run a script; --torchair: an unmodified TorchAir script",
        "Run an unmodified TorchAir script with airstream (--torchair; no other kind yet):\n"
        "`import torchair` and `import torch_npu` resolve to airstream, NPU tensors go to\n"
        "CUDA or the CPU, and when the script ends airstream says which ops ran on which\n"
        "stream. With GNU OpenMP and no OpenMP wait policy set, the script runs with\n"
        "GOMP_SPINCOUNT=10000 (idle OpenMP threads spin briefly, so multi-stream calls keep\n"
        "their cores after the script's own torch work); set GOMP_SPINCOUNT or\n"
        "OMP_WAIT_POLICY yourself to choose.",
        (
            "airstream run --torchair examples/torchair_guide.py",
            "airstream run --torchair infer.py --batch 8    # the script's own arguments follow",
        ),
        run_script,
        (
            arg("--torchair", action="store_true", help="resolve torchair/torch_npu here"),
            arg("script", help="the script to run"),
            arg("args", nargs=argparse.REMAINDER, help="the script's own arguments"),
        ),
    ),
    Command(
        "bench",
        "run a benchmark and print its figures",
        "Run one benchmark on this machine and print its figures (--json: as JSON).\n"
        "NAME is one of:\n" + "\n".join(f"  {n:<19}{b.summary}" for n, b in BENCHES.items()),
        (
            "airstream bench overhead",
            "airstream bench moe --mode both --rounds 5",
            "airstream bench decode --models llama --device cuda",
        ),
        commands.bench,
        (
            arg("name", metavar="NAME", choices=list(BENCHES), help="a name listed above"),
            arg(
                "--rounds",
                type=int,
                default=None,
                help="interleaved rounds (compile: fresh compiles each; restart: cold/warm process "
                f"pairs per case) ({default_help('rounds')})",
            ),
            arg(
                "--calls",
                type=int,
                default=None,
                help=f"calls per round (memory: training steps) ({default_help('calls')})",
            ),
            arg("--ops", type=int, default=200, help="overhead: ops in the chain"),
            arg("--experts", type=int, default=8, help="moe, threads: experts E (default 8)"),
            arg("--tokens", type=int, default=None, help=f"tokens B ({default_help('tokens')})"),
            arg(
                "--hidden", type=int, default=None, help=f"hidden size H ({default_help('hidden')})"
            ),
            arg("--no-inductor", action="store_true", help="skip the Inductor runner"),
            arg(
                "--passes",
                action="store_true",
                help="moe: time the stream passes (moe_experts, ...)",
            ),
            arg(
                "--mode",
                choices=["reduce-overhead", "max-autotune", "both"],
                default=None,
                help="branches-pointwise, moe, decode --alone: the airstream modes to time "
                "(default both)",
            ),
            arg(
                "--alone",
                action="store_true",
                help="decode: each runner in a fresh process per round (one stream and "
                "auto_streams "
                "per --mode, and Inductor), as a serving process runs one configuration",
            ),
            arg(
                "--no-compile-time",
                action="store_true",
                help="--mode: skip the compile-time measurements (fresh processes, cold/warm "
                "cache)",
            ),
            arg("--nproc", type=int, default=2, help="tp, microbatch: ranks to spawn (default 2)"),
            arg(
                "--sizes",
                default="",
                help="microbatch: comma-separated token counts (default 16,64,256,1024,4096,8192)",
            ),
            arg(
                "--comm",
                choices=["gloo", "modelled"],
                default="gloo",
                help="microbatch: gloo ranks over localhost, or one process whose collectives are "
                "modelled delays (--alpha-us + --beta-ns per byte, the GIL released)",
            ),
            arg(
                "--alpha-us",
                type=float,
                default=50.0,
                help="microbatch --comm modelled: a collective's latency in us (default 50)",
            ),
            arg(
                "--beta-ns",
                type=float,
                default=4.0,
                help="microbatch --comm modelled: ns per byte a collective carries (default 4)",
            ),
            arg(
                "--layers",
                type=int,
                default=None,
                help=f"tp, memory: layers ({default_help('layers')})",
            ),
            arg(
                "--models",
                default="",
                help="decode, train: comma-separated models (default all: qwen2-moe, deepseek-v3, "
                "llama); microbatch: (default both: tp, moe); serving-loop: (default all: moe, "
                "heads, "
                "decode); suite-models, compile: "
                "(default all of the model suite)",
            ),
            arg(
                "--cases",
                default="",
                help="restart: comma-separated cases (default all: inductor, airstream <mode>, "
                "cache_compile <mode>, auto_streams <mode>, ...; `airstream bench restart --json` "
                "lists them)",
            ),
            arg(
                "--device",
                default="cpu",
                help="moe, decode, branches-pointwise (and moe --mode): where the model runs, cpu "
                "or "
                "cuda[:N] (CUDA streams and events; each timed call ends with a synchronize)",
            ),
            arg("--json", action="store_true", help="print the report as JSON"),
        ),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``airstream`` command."""
    parser = argparse.ArgumentParser(
        prog="airstream",
        description="airstream: custom FX passes and multi-stream execution for torch.compile.\n"
        "`airstream COMMAND --help` says what a command does, with examples.",
        epilog="examples:\n  airstream demo\n  airstream doctor\n"
        "  airstream run --torchair examples/torchair_guide.py",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        added = sub.add_parser(
            command.name,
            help=command.summary,
            description=command.description,
            epilog="examples:\n" + "\n".join(f"  {line}" for line in command.examples),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        for argument in command.args:
            added.add_argument(*argument.names, help=argument.help, **argument.options)
        added.set_defaults(func=command.run)
    return parser
