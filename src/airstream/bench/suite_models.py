"""``airstream bench suite-models``: auto_streams against one stream on every model suite
architecture.

Each architecture of the model suite (``selftest/architectures.py``: transformers models at test
size, random weights) runs inference on ``LENGTHS[0]`` tokens, ``torch.compile``d three ways
with airstream in the mode in force (``AIRSTREAM_MODE``, else the default): on one stream;
``auto_streams`` measured (``stream_config.measure_placement``, called until every graph has
decided); and ``auto_streams predicted`` (the cost table's placement, not measured). Each
runner's output is checked against eager's first, then the three are timed interleaved in one
process, medians. The figure is each runner's speed over one stream's: the guard that a
placement never runs slower than one stream, on model code nobody here wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from airstream.bench.decode import PREDICTED, measure_until_decided
from airstream.bench.timing import interleaved_medians, run_conditions

__all__ = ["format_suite_models", "run_suite_models"]


def _runner(model: torch.nn.Module, backend: Any, inputs: dict[str, Any]) -> Any:
    compiled = torch.compile(model, backend=backend)

    def call() -> Any:
        with torch.no_grad():
            return compiled(**inputs)

    return call


def _first(output: Any) -> torch.Tensor:
    """The first tensor of a model's output (logits, or the last hidden state)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if hasattr(output, "values") else output
    return next(v for v in values if isinstance(v, torch.Tensor))


def run_suite_models(models: Sequence[str], rounds: int = 7, calls: int = 50) -> dict[str, Any]:
    """Per architecture: each runner's median ms per call, its speed over one stream's, and
    what auto_streams' measuring kept."""
    import airstream
    from airstream import passes
    from airstream.graph.mode import resolve_mode
    from airstream.selftest.architectures import ARCHS
    from airstream.selftest.models import LENGTHS, _inputs

    def backend(graph_pass: Any = None, measure: Any = "auto") -> Any:
        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = graph_pass
        config.stream_config.measure_placement = measure
        return airstream.get_backend(compiler_config=config)

    report: dict[str, Any] = {
        **run_conditions(rounds, calls),
        "benchmark": "suite-models",
        "mode": resolve_mode(airstream.CompilerConfig(), "cpu"),
        "tokens": LENGTHS[0],
        "models": {},
    }
    for name in models:
        arch = ARCHS[name]
        torch.compiler.reset()
        model = arch.build()
        inputs = _inputs(arch, LENGTHS[0])
        with torch.no_grad():
            want = _first(model(**inputs))
        backends = {
            "one stream": backend(),
            "auto_streams": backend(passes.auto_streams()),
            PREDICTED: backend(passes.auto_streams(), measure=False),
        }
        runners: dict[str, Callable[[], Any]] = {
            runner: _runner(model, b, inputs) for runner, b in backends.items()
        }
        for runner, call in runners.items():
            got = _first(call())
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3, msg=f"{name} {runner}")
        measured = measure_until_decided(backends["auto_streams"], runners["auto_streams"])
        medians = interleaved_medians(runners, rounds=rounds, calls_per_round=calls, warmup=2)
        one = medians["one stream"]
        report["models"][name] = {
            "ms": {runner: t * 1e3 for runner, t in medians.items()},
            "vs_one_stream": {runner: one / t for runner, t in medians.items()},
            "kept": [
                m.chosen
                for g in backends["auto_streams"].graphs
                if (m := g.measurement) is not None
            ],
            "measured": measured,
            "placed_by_table": any(g.streams.side_streams for g in backends[PREDICTED].graphs),
        }
    return report


def format_suite_models(report: dict[str, Any]) -> str:
    """The report as a table: per architecture, each runner over one stream."""
    lines = [
        f"suite-models: inference on {report['tokens']} tokens, {report['mode']}; medians of "
        f"{report['rounds']} interleaved rounds x {report['calls_per_round']} calls; torch "
        f"{report['torch']}, {report['cores']} cores",
        f"  {'model':<16} {'one stream':>11} {'auto_streams':>13} {PREDICTED:>23}  kept",
    ]
    worst = float("inf")
    for name, figures in report["models"].items():
        vs = figures["vs_one_stream"]
        worst = min(worst, vs["auto_streams"])
        kept = ", ".join(figures["kept"]) or "nothing to measure"
        placed = "" if figures["placed_by_table"] else " (the table placed nothing)"
        lines.append(
            f"  {name:<16} {figures['ms']['one stream']:8.2f} ms {vs['auto_streams']:12.2f}x "
            f"{vs[PREDICTED]:22.2f}x  {kept}{placed}"
        )
    lines.append(f"  lowest auto_streams / one stream: {worst:.2f}x")
    return "\n".join(lines)
