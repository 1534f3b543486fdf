"""``airstream demo``: the TorchAir custom-pass guide's example end to end, explained as it runs."""

from __future__ import annotations

import functools
import io
import os
from collections.abc import Sequence
from typing import Any

import torch

from airstream.backend import get_backend
from airstream.debug.dump import start_run
from airstream.debug.profile import profile
from airstream.debug.report import control_edges, format_streams, stream_name
from airstream.examples.guide import Model, custom_pre_pass
from airstream.options.config import CompilerConfig

__all__ = ["run_demo"]


def _heading(out: io.StringIO, text: str) -> None:
    out.write(f"\n== {text} ==\n")


def run_demo(size: int = 64, seed: int = 0, out_dir: str | None = None) -> tuple[str, bool]:
    """Compile and run the guide's example; return the report text and whether it matched eager.

    With ``out_dir``, also write the graph dumps (svg, or dot without Graphviz; the previous
    run's dumps there are deleted) and the profile of a few calls (Chrome trace and SVG
    timeline) there, and list them by absolute path."""
    out = io.StringIO()
    snapshots: dict[str, str] = {}

    @functools.wraps(custom_pre_pass)
    def observed_pass(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> None:
        snapshots["before"] = gm.code.strip()
        custom_pre_pass(gm, example_inputs, config)
        gm.recompile()
        snapshots["after"] = gm.code.strip()

    config = CompilerConfig()
    config.post_grad_custom_pre_pass = observed_pass
    if out_dir is not None:
        out_dir = os.path.abspath(out_dir)  # every path the demo prints is absolute
        config.debug.graph_dump.type = "svg"
        config.debug.graph_dump.path = os.path.join(out_dir, "dumps")
        start_run(config.debug.graph_dump.path)  # each demo run: 000 onwards, no stale files
    backend = get_backend(compiler_config=config)
    model = Model()
    compiled = torch.compile(model, backend=backend)

    torch.manual_seed(seed)
    x = torch.randn(size, size)
    got = compiled(x)
    want = model(x)

    graph = backend.graphs[-1]
    out.write(
        "airstream demo: the TorchAir custom-pass guide's example on CPU.\n"
        "Model: mm = x @ x; add = abs(mm) + 1; sub = x - mm. The custom pre pass puts mm and\n"
        "abs on stream 'stream_1', records an event after abs and makes sub wait for it.\n"
    )
    _heading(out, "graph before the custom pre pass")
    out.write(snapshots["before"] + "\n")
    _heading(out, "graph after the custom pre pass")
    out.write(snapshots["after"] + "\n")
    _heading(out, f"streams of the optimized {graph.kind} graph")
    out.write(format_streams(graph.graph_module, graph.streams) + "\n")
    _heading(out, "control edges")
    for edge in control_edges(graph.graph_module, graph.streams):
        out.write(f"{edge}\n")
    _heading(out, "passes run")
    for result in graph.passes:
        out.write(
            f"{result.stage:<28} {result.name:<48} {result.nodes_before:>3} -> "
            f"{result.nodes_after:<3} nodes  {result.seconds * 1e3:.2f} ms\n"
        )
    _heading(out, "stream plan (per stream: run / record / wait steps)")
    out.write(str(graph.plan) + "\n\n" + graph.plan.summary() + "\n")
    runtime = {
        "CpuExecutor": "CPU runtime: main stream on this thread, each side stream on its worker",
        "SerialExecutor": "serial reference executor: one thread, graph order",
    }.get(type(graph.executor).__name__, type(graph.executor).__name__)
    _heading(out, f"generated code that runs ({runtime})")
    out.write(graph.executor.code.strip() + "\n")
    if out_dir is not None:
        with profile() as prof:
            for _ in range(3):
                compiled(x)
        trace = prof.export_chrome_trace(os.path.join(out_dir, "trace.json"))
        timeline = prof.export_svg(os.path.join(out_dir, "timeline.svg"))
        _heading(out, "profile of 3 calls")
        out.write(prof.summary() + "\n")
        _heading(out, "files written")
        for path in [p for d in backend.dumpers for p in d.written]:
            out.write(f"dump      {path}\n")
        out.write(f"trace     {trace}  (open in Perfetto or chrome://tracing)\n")
        out.write(f"timeline  {timeline}\n")
    _heading(out, "result")
    ok = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    per_stream = {stream_name(s): len(graph.streams.nodes_on(s)) for s in graph.streams.streams}
    out.write(f"nodes per stream: {per_stream}\n")
    out.write(
        f"add and sub equal eager PyTorch (torch.equal, {size}x{size} input): "
        f"{'yes' if ok else 'NO'}\n"
    )
    return out.getvalue(), ok
