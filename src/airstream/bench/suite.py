"""``airstream bench moe-shared|branches|mlp`` (and the pass runners for ``moe``): each model next
to eager, Inductor and single-stream airstream (torch's default intra-op threads, and 1 thread),
with the stream passes that apply to it. Multi-stream runners use 1 intra-op thread per stream,
the caller included (the runtime sets it)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from airstream.backend import get_backend
from airstream.bench.models import Branches, Mlp, MoEShared
from airstream.bench.moe import MoE, split_experts
from airstream.bench.timing import checked_medians, run_conditions
from airstream.options.config import CompilerConfig
from airstream.passes.auto import auto_streams, moe_experts, shared_expert_overlap
from airstream.runtime.measured import ONE_STREAM

__all__ = ["MODELS", "format_suite", "run_suite"]


def _model(name: str, hidden: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model and the passes to run on it (runner name -> pass)."""
    if name == "moe":
        return MoE(8, hidden), {
            "hand-placed 2 streams": split_experts(2),
            "moe_experts": moe_experts(),
            "auto_streams flops": auto_streams(cost_model="flops"),
            "auto_streams profile": auto_streams(cost_model="profile"),
        }
    if name == "moe-shared":
        return MoEShared(8, hidden), {
            "shared_expert_overlap": shared_expert_overlap(),
            "moe_experts": moe_experts(),
            "auto_streams flops": auto_streams(cost_model="flops"),
        }
    if name == "branches":
        return Branches(hidden), {
            "auto_streams flops": auto_streams(cost_model="flops"),
            "auto_streams profile": auto_streams(cost_model="profile"),
        }
    if name == "mlp":
        return Mlp(hidden), {
            "moe_experts": moe_experts(),
            "shared_expert_overlap": shared_expert_overlap(),
            "auto_streams flops": auto_streams(cost_model="flops"),
        }
    raise ValueError(f"unknown benchmark model {name!r}; choose from {sorted(MODELS)}")


MODELS = ("moe", "moe-shared", "branches", "mlp")


def _compiled(model: torch.nn.Module, graph_pass: Any) -> Any:
    config = CompilerConfig()
    if graph_pass is not None:
        config.post_grad_custom_pre_pass = graph_pass
    backend = get_backend(config)
    return torch.compile(model, backend=backend), backend


def run_suite(
    name: str,
    tokens: int = 8,
    hidden: int = 1024,
    rounds: int = 11,
    calls: int = 5,
    inductor: bool = True,
) -> dict[str, Any]:
    """Time eager, Inductor, airstream 1 stream and airstream with each pass; medians (ms)."""
    threads = torch.get_num_threads()
    torch.manual_seed(0)
    model, passes = _model(name, hidden)
    model.eval()
    x = torch.randn(tokens, hidden)
    candidates: dict[str, Callable[[], Any]] = {"eager": lambda: model(x)}
    if inductor:
        opt = torch.compile(model)
        candidates["inductor"] = lambda: opt(x)
    single, _ = _compiled(model, None)
    candidates["airstream 1 stream"] = lambda: single(x)

    def single_one_thread() -> Any:
        torch.set_num_threads(1)
        try:
            return single(x)
        finally:
            torch.set_num_threads(threads)

    candidates["airstream 1 stream, 1 thread"] = single_one_thread
    streams: dict[str, int] = {}
    backends = {}
    for runner, graph_pass in passes.items():
        compiled, backend = _compiled(model, graph_pass)
        candidates[f"airstream {runner}"] = functools.partial(compiled, x)
        backends[runner] = backend
    with torch.no_grad():
        want = model(x)
    medians = checked_medians(candidates, want, rounds=rounds, calls_per_round=calls)
    measured: dict[str, str] = {}
    for runner, backend in backends.items():
        graph = backend.graphs[-1]
        streams[runner] = len([s for s in graph.plan.streams if s.runs])
        if graph.measurement is not None:  # the streams it runs are what the measuring kept
            measured[runner] = graph.measurement.describe()
            if graph.measurement.chosen == ONE_STREAM:
                streams[runner] = 1
    base = medians["airstream 1 stream"]
    base_one = medians["airstream 1 stream, 1 thread"]
    return {
        "benchmark": name,
        "tokens": tokens,
        "hidden": hidden,
        **run_conditions(rounds, calls),
        "ms": {k: v * 1e3 for k, v in medians.items()},
        "speedup_vs_1_stream": {k: base / v for k, v in medians.items()},
        "speedup_vs_1_stream_1_thread": {k: base_one / v for k, v in medians.items()},
        "streams_used": streams,
        "measured": measured,
    }


def format_suite(report: dict[str, Any]) -> str:
    """The report as a table."""
    lines = [
        f"{report['benchmark']}: B={report['tokens']}, H={report['hidden']}, float32; "
        f"{report['cores']} cores, torch {report['torch']}; {report['rounds']} interleaved "
        f"rounds x {report['calls_per_round']} calls, medians",
        f"{'runner':<36}{'ms':>9}{'vs 1 stream':>13}{'vs 1 stream 1 thread':>22}{'streams':>9}",
    ]
    for runner, ms in report["ms"].items():
        used = report["streams_used"].get(runner.removeprefix("airstream "), "")
        lines.append(
            f"{runner:<36}{ms:>9.2f}{report['speedup_vs_1_stream'][runner]:>12.2f}x"
            f"{report['speedup_vs_1_stream_1_thread'][runner]:>21.2f}x{used!s:>9}"
        )
    for runner, words in report.get("measured", {}).items():
        lines.append(f"  {runner}: placement measured against one stream: {words}")
    return "\n".join(lines)


def pass_timing(chains: int = 50, length: int = 100) -> dict[str, Any]:
    """Seconds each stream pass takes on a graph of ``chains`` independent chains of ``length``
    unary ops (over 5,000 nodes)."""
    import time

    from torch.fx.experimental.proxy_tensor import make_fx

    def chain(x: torch.Tensor) -> torch.Tensor:
        outs = []
        for _ in range(chains):
            y = x
            for _ in range(length):
                y = y.sin()
            outs.append(y)
        return torch.stack(outs).sum(0)

    timings: dict[str, float] = {}
    nodes = 0
    for name, graph_pass in {
        "auto_streams flops": auto_streams(cost_model="flops"),
        "moe_experts": moe_experts(),
        "shared_expert_overlap": shared_expert_overlap(),
    }.items():
        gm = make_fx(chain, tracing_mode="fake")(torch.randn(64))
        nodes = len(gm.graph.nodes)
        start = time.perf_counter()
        graph_pass(gm, [], None)
        timings[name] = time.perf_counter() - start
    return {"benchmark": "passes", "nodes": nodes, "seconds": timings}
