"""``airstream bench threads``: threads per stream as a measured candidate.

``bench moe``'s dense split (the odd experts on a side stream, :func:`split_experts`) compiled
with ``stream_config.measure_placement`` on and ``measure_threads`` set to every other count
this process could give a stream (the intra-op threads split over the 2 streams, and all of
them), measured ``trials`` times in fresh compiles; then each thread count's program, and one
stream, compiled with measuring off and timed in its steady state, interleaved, medians. The
report sets the measured decisions beside the steady state: does measuring keep the count that
runs fastest afterwards?
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airstream.backend import get_backend
from airstream.bench.moe import MoE, split_experts
from airstream.bench.timing import checked_medians, run_conditions
from airstream.options.config import CompilerConfig

__all__ = ["format_threads", "run_threads", "thread_counts"]


def thread_counts() -> tuple[int, ...]:
    """1 thread per stream, the process's intra-op threads split over 2 streams, and all of
    them (distinct, ascending)."""
    every = torch.get_num_threads()
    return tuple(sorted({1, max(1, every // 2), every}))


def _compiled(
    model: MoE, x: torch.Tensor, split: bool, threads: int, others: tuple[int, ...], measure: bool
) -> tuple[Callable[[], torch.Tensor], Any]:
    config = CompilerConfig()
    config.post_grad_custom_pre_pass = split_experts(2) if split else None
    config.stream_config.measure_placement = measure
    config.stream_config.threads_per_stream = threads
    config.stream_config.measure_threads = others
    backend = get_backend(config)
    compiled = torch.compile(model, backend=backend)

    def call() -> torch.Tensor:
        with torch.no_grad():
            return compiled(x)

    return call, backend


def run_threads(
    experts: int = 8,
    tokens: int = 8,
    hidden: int = 1024,
    rounds: int = 15,
    calls: int = 5,
    trials: int = 3,
) -> dict[str, Any]:
    """The measured decisions of ``trials`` fresh compiles, and each candidate's steady state
    (median ms, and its speed over one stream's)."""
    torch.manual_seed(0)
    model = MoE(experts, hidden).eval()
    x = torch.randn(tokens, hidden)
    with torch.no_grad():
        want = model(x)
    counts = thread_counts()
    decisions = []
    for _ in range(trials):
        torch.compiler.reset()
        call, backend = _compiled(model, x, True, counts[0], counts[1:], True)
        for _ in range(64 * len(counts)):
            torch.testing.assert_close(call(), want, rtol=1e-4, atol=1e-4)
            measured = [g.measurements for g in backend.graphs if g.measurements is not None]
            if measured and all(m.decided for m in measured):
                break
        decisions.append("; ".join(m.describe() for m in measured) or "nothing measured")
    torch.compiler.reset()
    runners = {"one stream": _compiled(model, x, False, 1, (), False)[0]}
    for count in counts:
        runners[_name(count)] = _compiled(model, x, True, count, (), False)[0]
    medians = checked_medians(runners, want, rounds=rounds, calls_per_round=calls)
    one = medians["one stream"]
    return {
        "benchmark": "threads",
        "experts": experts,
        "tokens": tokens,
        "hidden": hidden,
        **run_conditions(rounds, calls),
        "thread_counts": list(counts),
        "measured": decisions,
        "ms": {name: t * 1e3 for name, t in medians.items()},
        "vs_one_stream": {name: one / t for name, t in medians.items()},
    }


def _name(threads: int) -> str:
    return f"2 streams, {threads} thread{'s' * (threads > 1)} each"


def format_threads(report: dict[str, Any]) -> str:
    """The report as text: the decisions, then the steady state."""
    lines = [
        f"threads: bench moe's split of {report['experts']} experts over 2 streams (B="
        f"{report['tokens']}, H={report['hidden']}), measured with "
        f"{report['thread_counts']} threads per stream; torch {report['torch']}, "
        f"{report['cores']} cores"
    ]
    for i, decision in enumerate(report["measured"], 1):
        lines.append(f"  measured, compile {i}: {decision}")
    lines.append(
        f"  steady state, measuring off (medians of {report['rounds']} interleaved rounds x "
        f"{report['calls_per_round']} calls):"
    )
    for name, ms in report["ms"].items():
        speed = report["vs_one_stream"][name]
        lines.append(f"    {name:<26} {ms:8.2f} ms  {speed:5.2f}x of one stream")
    return "\n".join(lines)
