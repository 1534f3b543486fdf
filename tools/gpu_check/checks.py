"""The GPU checks that run in a process of their own (``tools/gpu-check --preflight``,
``--trace``, ``--baseline``), each printing its JSON report: the machine's pieces, one profiled
multi-stream call, and airstream's reduce-overhead beside Inductor's."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from gpu_check import environment, processes


def trace(path: Path, device: str) -> dict[str, Any]:
    """Profile one 2-stream MoE call on ``device``; write the Chrome trace; return its facts."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import airstream
    from airstream.bench.moe import MoE, split_experts

    torch.manual_seed(0)
    model = MoE(4, 256).eval().to(device)
    x = torch.randn(8, 256, device=device)
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"  # reduce-overhead would replay one CUDA graph: one stream seen
    config.post_grad_custom_pre_pass = split_experts(2)
    backend = airstream.get_backend(config)
    compiled = torch.compile(model, backend=backend)
    cuda = device.startswith("cuda")
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        if cuda:
            torch.cuda.synchronize()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            out = compiled(x)
            if cuda:
                torch.cuda.synchronize()
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and e.get("ph") == "X"]
    by_stream: dict[str, list[tuple[float, float]]] = {}
    for k in kernels:
        stream = str(k.get("args", {}).get("stream", k.get("tid")))
        by_stream.setdefault(stream, []).append((k["ts"], k["ts"] + k["dur"]))
    overlap = 0.0
    streams = sorted(by_stream)
    for i, a in enumerate(streams):
        for b in streams[i + 1 :]:
            for s1, e1 in by_stream[a]:
                for s2, e2 in by_stream[b]:
                    overlap += max(0.0, min(e1, e2) - max(s1, s2))
    executor = backend.graphs[-1].executor
    return {
        "trace": path.name,
        "device": device,
        "executor": type(executor).__name__,
        "plan_streams": [str(s.label or "main") for s in backend.graphs[-1].plan.streams if s.runs],
        "trace_events": len(events),
        "kernels": len(kernels),
        "kernel_streams": {s: len(v) for s, v in by_stream.items()},
        "kernel_overlap_us": round(overlap, 1),
    }


def graph_facts(backend: Any) -> list[dict[str, Any]]:
    """Each compiled graph's executor, and for a CUDA graph executor whether it captured."""
    facts = []
    for graph in backend.graphs:
        executor = graph.executor
        entry: dict[str, Any] = {"kind": graph.kind, "executor": type(executor).__name__}
        if hasattr(executor, "captures"):
            entry["captures"] = executor.captures
            entry["blockers"] = list(getattr(executor, "blockers", []))
        facts.append(entry)
    return facts


def baseline(device: str) -> tuple[dict[str, Any], list[str]]:
    """The MoE block in airstream's reduce-overhead (2 streams, 1 stream) beside Inductor's
    mode="reduce-overhead" and eager: checked against eager, then timed interleaved. Returns the
    report and what failed."""
    import torch

    import airstream
    from airstream.bench.moe import MoE, split_experts

    cuda = device.startswith("cuda")
    experts, tokens, hidden = (8, 8, 1024) if cuda else (2, 2, 64)
    rounds, warmup = 30, 5
    torch.manual_seed(0)
    model = MoE(experts, hidden).eval().to(device)
    x = torch.randn(tokens, hidden, device=device)
    backends = {}
    runners: dict[str, Any] = {"eager": lambda: model(x)}
    notes, failures = [], []
    if cuda:
        inductor = torch.compile(model, mode="reduce-overhead")

        def inductor_call() -> Any:
            torch.compiler.cudagraph_mark_step_begin()  # its last outputs may be overwritten
            return inductor(x)

        runners["inductor reduce-overhead"] = inductor_call
    else:
        notes.append("Inductor's reduce-overhead (CUDA graph trees) needs CUDA: left out")
    for streams in (2, 1):
        name = f"airstream reduce-overhead {streams} stream{'s' if streams > 1 else ''}"
        config = airstream.CompilerConfig()
        config.mode = "reduce-overhead"
        if streams == 2:
            config.post_grad_custom_pre_pass = split_experts(2)
        backend = airstream.get_backend(config)
        backends[name] = backend
        compiled = torch.compile(model, backend=backend)
        runners[name] = lambda compiled=compiled: compiled(x)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    with torch.no_grad():
        want = model(x)
        for name, fn in list(runners.items()):
            try:
                for _ in range(warmup):
                    got = fn().clone()
                sync()
                torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
            except Exception as error:
                failures.append(
                    f"{name}: {type(error).__name__}: {processes.first_lines(str(error), 3)}"
                )
                del runners[name]
        samples: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(rounds):  # A B C A B C ...: drift hits every runner alike
            for name, fn in runners.items():
                sync()
                start = time.perf_counter()
                fn()
                sync()
                samples[name].append(time.perf_counter() - start)
    ms = {name: round(statistics.median(s) * 1e3, 4) for name, s in samples.items()}
    graphs = {name: graph_facts(backend) for name, backend in backends.items()}
    for name, facts in graphs.items():
        if not facts:
            failures.append(f"{name}: airstream compiled no graph")
        for fact in facts if cuda else ():
            if not fact.get("captures") or fact.get("blockers"):
                why = "; ".join(fact.get("blockers", [])) or "no capture"
                failures.append(f"{name}: {fact['kind']} graph not captured ({why})")
    plan = backends["airstream reduce-overhead 2 streams"].graphs
    streams = [str(s.label or "main") for s in plan[-1].plan.streams if s.runs] if plan else []
    if len(streams) < 2:
        failures.append(f"airstream reduce-overhead 2 streams: the plan runs {streams}")
    inductor_ms = ms.get("inductor reduce-overhead")
    ratios = {
        name.removeprefix("airstream reduce-overhead "): round(value / inductor_ms, 3)
        for name, value in ms.items()
        if name.startswith("airstream") and inductor_ms
    }
    report = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "torch": torch.__version__,
        "model": f"MoE: {experts} experts, hidden {hidden}, {tokens} tokens, float32",
        "timing": f"{rounds} interleaved rounds of one synchronized call each after {warmup} "
        "warm-up calls, medians",
        "ms": ms,
        "ms_ratio_airstream_over_inductor": ratios or None,
        "airstream_graphs": graphs,
        "plan_streams_2": streams,
        "notes": notes,
        "failures": failures,
    }
    return report, failures


def main(args: argparse.Namespace) -> int:
    """The checks that run in a process of their own: --preflight, --trace, --baseline."""
    if args.preflight:
        facts = environment.preflight()
        print(json.dumps(facts, indent=2))
        return 0
    if args.baseline:
        report, failures = baseline(args.device)
        print(json.dumps(report, indent=2))
        for failure in failures:
            print(f"gpu-check baseline: {failure}", file=sys.stderr)
        return 1 if failures else 0
    facts = trace(Path(args.trace), args.device)
    print(json.dumps(facts, indent=2))
    if len(facts["plan_streams"]) < 2:
        print("gpu-check trace: the call ran on one stream", file=sys.stderr)
        return 1
    if args.device.startswith("cuda") and len(facts["kernel_streams"]) < 2:
        print("gpu-check trace: every kernel ran on one CUDA stream", file=sys.stderr)
        return 1
    return 0
