"""``airstream bench serving-loop``: compiled models called the way a serving loop calls them.

A serving loop does ordinary torch work between model calls (logits processing, sampling, the
tokenizer's tensors) with torch's default intra-op threads. That work leaves OpenMP's threads
spinning on the cores a multi-stream call needs (see ``airstream.machine.openmp``). Each model is
timed two ways, runners interleaved, medians:

- ``alone``: calls back to back, nothing else in the loop;
- ``loop``: every call preceded by one step of eager sampling work (a vocabulary projection,
  softmax, top-k, cumulative sum) on torch's default intra-op threads.

Runners: ``eager``; ``1 stream`` (airstream, nothing on a side stream); then the model's stream
pass three ways: ``streams`` (the default: side streams on the caller's OpenMP team where it can,
``stream_config.openmp_team``), ``streams, workers`` (a worker thread per side stream, the
caller's idle team released first where the OpenMP policy in force spins long,
``stream_config.release_openmp_threads``) and ``streams, no release`` (workers without the
release: the runtime before either fix). The report names the policy in force; run it again
under ``GOMP_SPINCOUNT=10000`` (what ``airstream run`` sets) for the launch-time fix. ``call``
is the model call alone; ``iteration`` is the sampling step plus the call, and ``work`` the sampling
step alone, after that runner's previous call: what the fix costs the eager work (OpenMP's
threads started again) shows there. Models:

- ``moe``: 8 dense experts (``bench moe``'s block), B=8, H=1024; the experts split over 2 streams
  (``split_experts``);
- ``heads``: four independent Linear -> ReLU -> Linear heads of widths 256..1024 on one input;
  ``auto_streams``;
- ``decode``: a Qwen2-MoE-style transformers decode step (``bench decode``'s qwen2-moe, static KV
  cache); ``shared_expert_overlap``.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from airstream.backend import get_backend
from airstream.bench.moe import MoE, split_experts
from airstream.bench.timing import run_conditions
from airstream.machine.openmp import openmp
from airstream.options.config import CompilerConfig
from airstream.passes.auto import auto_streams
from airstream.runtime.handoff import describe as describe_handoff

__all__ = ["SERVING_MODELS", "Heads", "format_serving", "run_serving"]

SERVING_MODELS = ("moe", "heads", "decode")


class Heads(torch.nn.Module):
    """Independent ``Linear(H, w) -> ReLU -> Linear(w, H)`` heads on one input, one per width."""

    def __init__(self, hidden: int = 1024, widths: tuple[int, ...] = (256, 512, 768, 1024)):
        super().__init__()
        self.heads = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.Linear(hidden, w), torch.nn.ReLU(), torch.nn.Linear(w, hidden)
            )
            for w in widths
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [head(x) for head in self.heads]


class _Sampler:
    """One step of a serving loop's eager work: project to an 8k vocabulary, softmax, top-k,
    cumulative probabilities (top-p), the chosen token."""

    def __init__(self, batch: int, hidden: int, vocab: int = 8192) -> None:
        generator = torch.Generator().manual_seed(2)
        self.hidden = torch.randn(batch, hidden, generator=generator)
        self.head = torch.randn(vocab, hidden, generator=generator) / hidden**0.5

    def __call__(self) -> torch.Tensor:
        logits = self.hidden @ self.head.t()
        probs = torch.softmax(logits / 0.7, dim=-1)
        top, index = torch.topk(probs, 50, dim=-1)
        keep = torch.cumsum(top, dim=-1) < 0.9
        return index.gather(-1, torch.argmax(top * keep, dim=-1, keepdim=True))


# Runner -> (openmp_team, release_openmp_threads) for the model's stream pass.
_STREAM_RUNNERS = {
    "streams": (True, True),
    "streams, workers": (False, True),
    "streams, no release": (False, False),
}


def _backend(graph_pass: Any, team: bool = True, release: bool = True) -> Any:
    config = CompilerConfig()
    config.post_grad_custom_pre_pass = graph_pass
    config.stream_config.openmp_team = team
    config.stream_config.release_openmp_threads = release
    return get_backend(config)


def _tensor_model(name: str, batch: int, hidden: int) -> tuple[Callable[..., Any], Any, Any]:
    """The model, its input and its stream pass."""
    torch.manual_seed(0)
    if name == "moe":
        return MoE(8, hidden).eval(), torch.randn(batch, hidden), split_experts(2)
    return Heads(hidden).eval(), torch.randn(batch, hidden), auto_streams()


def _runners(name: str, batch: int, hidden: int) -> dict[str, Callable[[], Any]]:
    """Runner name -> one call of the model, every runner's result checked against eager's."""
    if name == "decode":
        from airstream.bench.decode import build_model, decode_step
        from airstream.passes.auto import shared_expert_overlap

        model, shared = build_model("qwen2-moe")
        assert shared is not None  # qwen2-moe has a shared expert
        graph_pass = shared_expert_overlap(shared=shared)
        backends: dict[str, Any] = {"eager": None, "1 stream": _backend(None)}
        backends.update({r: _backend(graph_pass, *how) for r, how in _STREAM_RUNNERS.items()})
        calls = {r: decode_step(model, b, batch, 32, 40)[0] for r, b in backends.items()}
    else:
        model, x, graph_pass = _tensor_model(name, batch, hidden)
        compiled = {"1 stream": torch.compile(model, backend=_backend(None))}
        compiled.update(
            {
                r: torch.compile(model, backend=_backend(graph_pass, *how))
                for r, how in _STREAM_RUNNERS.items()
            }
        )
        calls = {"eager": lambda: model(x)}
        calls.update({r: functools.partial(fn, x) for r, fn in compiled.items()})
    with torch.no_grad():
        want = calls["eager"]()
        for runner, call in calls.items():
            torch.testing.assert_close(call(), want, rtol=1e-3, atol=1e-3, msg=runner)
    return calls


def _time(
    calls: dict[str, Callable[[], Any]], work: Callable[[], Any] | None, rounds: int, per: int
) -> dict[str, dict[str, float]]:
    """Median ms per call and per iteration (``work`` then the call), runners interleaved.

    Round ``r`` starts with runner ``r mod n``, so no runner always follows the same one. Without
    ``work``, each runner's timed calls follow 2 untimed ones: a call must not pay for OpenMP
    threads the previous runner left spinning (that is the loop condition's subject)."""
    samples: dict[str, tuple[list[float], list[float]]] = {r: ([], []) for r in calls}
    order = list(calls)
    clock = time.perf_counter
    with torch.no_grad():
        for call in calls.values():  # warm up, the loop's way
            for _ in range(3):
                if work is not None:
                    work()
                call()
        for r in range(rounds):
            for runner in order[r % len(order) :] + order[: r % len(order)]:
                call = calls[runner]
                if work is None:
                    call()
                    call()
                for _ in range(per):
                    begin = clock()
                    if work is not None:
                        work()
                    start = clock()
                    call()
                    end = clock()
                    samples[runner][0].append(end - start)
                    samples[runner][1].append(end - begin)
    return {
        runner: {
            "call_ms": statistics.median(c) * 1e3,
            "iteration_ms": statistics.median(i) * 1e3,
            "work_ms": statistics.median(b - a for a, b in zip(c, i, strict=True)) * 1e3,
        }
        for runner, (c, i) in samples.items()
    }


def run_serving(
    models: tuple[str, ...] = SERVING_MODELS,
    batch: int = 8,
    hidden: int = 1024,
    rounds: int = 15,
    calls: int = 5,
) -> dict[str, Any]:
    """Per model and condition (``alone``, ``loop``): each runner's median ms (see module doc)."""
    report: dict[str, Any] = {
        **run_conditions(rounds, calls),
        "intra_op_threads": torch.get_num_threads(),
        "openmp_policy": openmp().policy,
        "release_acts": openmp().spins_long,
        "side_threads": describe_handoff(),
        "batch": batch,
        "hidden": hidden,
        "models": {},
    }
    sampler = _Sampler(batch, hidden)
    for name in models:
        torch.compiler.reset()
        runners = _runners(name, 4 if name == "decode" else batch, hidden)
        report["models"][name] = {
            "alone": _time(runners, None, rounds, calls),
            "loop": _time(runners, sampler, rounds, calls),
        }
        del runners
    return report


def format_serving(report: dict[str, Any]) -> str:
    """The report as text: per model and condition, each runner's call and iteration times and
    the ratios the fix is judged by."""
    lines = [
        f"serving loop: medians of {report['rounds']} interleaved rounds x "
        f"{report['calls_per_round']} calls; torch {report['torch']}, {report['cores']} cores, "
        f"{report['intra_op_threads']} intra-op threads for eager work",
        f"  OpenMP: {report['openmp_policy']}; release "
        + ("acts" if report["release_acts"] else "is skipped (the spin is short)"),
        f"  side streams: {report['side_threads']}",
        "  loop: each call after one eager sampling step (work: that step's time); "
        "x: 1 stream's call time / this one's",
    ]
    for name, conditions in report["models"].items():
        lines.append(f"  {name}:")
        for condition, runners in conditions.items():
            one = runners["1 stream"]["call_ms"]
            eager = runners["eager"]["call_ms"]
            lines.append(f"    {condition}:")
            for runner, figures in runners.items():
                work = f"  work {figures['work_ms']:7.3f} ms" if condition == "loop" else ""
                lines.append(
                    f"      {runner:<20} call {figures['call_ms']:8.3f} ms "
                    f"{one / figures['call_ms']:5.2f}x  vs eager "
                    f"{eager / figures['call_ms']:5.2f}x{work}"
                )
    return "\n".join(lines)
