"""``airstream bench kernel-split``: Inductor's CPU kernels on two streams at once.

The model: ``branches`` independent chains of ten pointwise ops (a different constant each, so
that nothing is common to two of them) on one ``tokens x hidden`` input, summed: work that
Inductor fuses into one kernel per chain and that splits cleanly in two. Every runner but the
last gets one intra-op thread per stream, the split this benchmark is about:

- ``inductor, 1 thread``: ``torch.compile`` as it is, the work one after the other;
- ``airstream 1 stream``: Inductor segments (the default mode on CPU) on one stream;
- ``airstream 2 streams``: chain ``i`` on stream ``i % 2`` (a pass; the model is not edited);
- ``hand-written threads (Inductor parts)``: each chain compiled alone, with its kernels letting
  go of the GIL as airstream's do, odd ones on a persistent Python thread: the ceiling of this
  split on this machine, with no compiler runtime in between (left out with
  ``AIRSTREAM_KERNEL_GIL=hold``: a chain compiled alone is the same code as airstream's segment
  for it, and a process loads one module per code, so one of the two would not be as set);
- ``hand-written threads (eager parts)``: the same split of eager ATen ops;
- ``inductor, N threads``: ``torch.compile`` with torch's intra-op threads (every core), what
  the machine gives the work without streams.

Whether airstream's kernels let go of the GIL is ``AIRSTREAM_KERNEL_GIL`` (``release``, the
default, or ``hold``: as Inductor binds them), read once per process since a loaded kernel stays
as it loaded; run the benchmark once with each to see what releasing gains. The report adds the
2-stream runner's profile: how many streams were busy at once while any was.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from airstream import torch_internals
from airstream.backend import get_backend
from airstream.bench.moe import split_experts
from airstream.bench.timing import checked_medians, run_conditions, with_threads
from airstream.debug.profile import profile
from airstream.machine import environment
from airstream.options.config import CompilerConfig

__all__ = [
    "HandSplit",
    "PointwiseChain",
    "format_kernel_split",
    "inductor_parts",
    "run_kernel_split",
]


class PointwiseChain(torch.nn.Module):
    """Ten elementwise ops, with ``scale`` in every other one."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        for i in range(10):
            if i % 2:
                y = torch.sin(y) * self.scale + 0.125
            else:
                y = torch.tanh(y) - y.abs() * 0.25
        return y


class Chains(torch.nn.Module):
    """``branches`` :class:`PointwiseChain` s on the same input, summed."""

    def __init__(self, branches: int) -> None:
        super().__init__()
        self.branches = torch.nn.ModuleList(PointwiseChain(1.0 + i / 64) for i in range(branches))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [branch(x) for branch in self.branches]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total


class HandSplit:
    """The ceiling of a 2-way split without a compiler's runtime: odd parts on a persistent
    Python thread, even ones on the caller (one intra-op thread each), then the sum."""

    def __init__(self, parts: Sequence[Callable[[torch.Tensor], Any]], x: torch.Tensor) -> None:
        self.parts, self.x = parts, x
        self.go, self.done = threading.Semaphore(0), threading.Semaphore(0)
        self.odd: list[torch.Tensor] = []
        threading.Thread(target=self._worker, daemon=True, name="bench-kernel-split").start()

    def _worker(self) -> None:
        torch.set_num_threads(1)
        while True:
            self.go.acquire()
            with torch.no_grad():
                self.odd = [p(self.x) for p in self.parts[1::2]]
            self.done.release()

    def __call__(self) -> torch.Tensor:
        self.go.release()
        even = [p(self.x) for p in self.parts[0::2]]
        self.done.acquire()
        total = even[0]
        for out in [*even[1:], *self.odd]:
            total = total + out
        return total


def _airstream(model: torch.nn.Module, streams: int) -> Any:
    config = CompilerConfig()
    config.mode = "max-autotune"  # what the default mode is on CPU, whatever AIRSTREAM_MODE says
    if streams > 1:
        config.post_grad_custom_pre_pass = split_experts(streams, r"branches\.(\d+)")
    return torch.compile(model, backend=get_backend(config))


def inductor_parts(parts: Sequence[torch.nn.Module], x: torch.Tensor) -> list[Any]:
    """Each part compiled by Inductor for one thread, its kernels bound as airstream's segments'
    are (AIRSTREAM_KERNEL_GIL: without the GIL by default; with Inductor's binding the two
    threads' kernels take turns)."""
    compiled = [torch.compile(p, options={"cpp.threads": 1}) for p in parts]
    released = environment.AIRSTREAM_KERNEL_GIL.read() == "release"
    binding = torch_internals.kernels_without_gil() if released else contextlib.nullcontext()
    with binding, torch.no_grad():
        for part in compiled:
            part(x)  # torch.compile compiles, and loads the kernels, at the first call
    return compiled


def run_kernel_split(
    branches: int = 4, tokens: int = 256, hidden: int = 1024, rounds: int = 15, calls: int = 5
) -> dict[str, Any]:
    """Time the runners above, interleaved; medians in ms, and the 2-stream runner's overlap."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    model, x = Chains(branches).eval(), torch.randn(tokens, hidden)
    parts = list(model.branches)
    one, two = _airstream(model, 1), _airstream(model, 2)
    inductor = torch.compile(model)
    released = environment.AIRSTREAM_KERNEL_GIL.read() == "release"
    runners: dict[str, Callable[[], Any]] = {
        "inductor, 1 thread": with_threads(1, lambda: inductor(x)),
        "airstream 1 stream": with_threads(1, lambda: one(x)),
        "airstream 2 streams": with_threads(1, lambda: two(x)),
    }
    with torch.no_grad():
        want = model(x)
        for run in runners.values():  # compiled, at one thread each, before the parts are
            run()
    if released:
        split = HandSplit(inductor_parts(parts, x), x)
        runners["hand-written threads (Inductor parts)"] = with_threads(1, split)
    runners["hand-written threads (eager parts)"] = with_threads(1, HandSplit(parts, x))
    if threads > 1:
        runners[f"inductor, {threads} threads"] = with_threads(threads, lambda: inductor(x))
    medians = checked_medians(runners, want, rounds=rounds, calls_per_round=calls, settle=1)
    torch.set_num_threads(1)
    try:
        with torch.no_grad(), profile() as prof:
            for _ in range(calls):
                two(x)
    finally:
        torch.set_num_threads(threads)
    return {
        "benchmark": "kernel-split",
        "branches": branches,
        "tokens": tokens,
        "hidden": hidden,
        "kernel_gil": environment.AIRSTREAM_KERNEL_GIL.read(),
        **run_conditions(rounds, calls),
        "ms": {name: seconds * 1e3 for name, seconds in medians.items()},
        "streams_busy_at_once": prof.overlap(),
    }


def format_kernel_split(report: dict[str, Any]) -> str:
    """The report as a table, each runner against ``inductor, 1 thread``."""
    ms = report["ms"]
    reference = ms["inductor, 1 thread"]
    lines = [
        f"kernel-split: {report['branches']} pointwise chains on a {report['tokens']}x"
        f"{report['hidden']} float32 input; {report['cores']} cores, torch {report['torch']}, "
        f"AIRSTREAM_KERNEL_GIL={report['kernel_gil']}; {report['rounds']} interleaved rounds x "
        f"{report['calls_per_round']} calls (after 1 untimed call), medians",
        f"{'runner':<40}{'ms':>9}{'vs inductor, 1 thread':>24}",
    ]
    for runner, value in ms.items():
        lines.append(f"{runner:<40}{value:>9.2f}{reference / value:>23.2f}x")
    lines.append(
        f"airstream 2 streams, profiled: {report['streams_busy_at_once']:.2f} streams busy at "
        "once while any was (1.00: they took turns, 2.00: always both)"
    )
    return "\n".join(lines)
