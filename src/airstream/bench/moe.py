"""``airstream bench moe``: a dense mixture-of-experts block, eager vs Inductor vs airstream.

E experts, each ``Linear(H, 4H) -> GELU -> Linear(4H, H)``, all applied to the same B tokens and
summed (dense, so deterministic). Runners, timed interleaved with medians:

- eager with torch's default intra-op threads, and with 1 thread,
- ``torch.compile`` with Inductor (default settings),
- airstream on one stream (torch's default intra-op threads: what a user gets),
- airstream with the experts split over 2 streams by :func:`split_experts` (the odd experts on a
  side stream; ``threads_per_stream`` = 1 intra-op thread per stream, which the runtime also
  applies to the calling thread during the call, so it is called from torch's default setting),
- hand-written threads: the same split written by hand with a Python thread (eager, 1 intra-op
  thread each), no compiler: what this machine gives two concurrent streams of this work.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from airstream.backend import get_backend
from airstream.bench.timing import (
    checked_medians,
    cuda_graphs,
    run_conditions,
    synchronized,
    with_threads,
)
from airstream.bench.verdict import never_slower, never_slower_line
from airstream.ops.library import STREAM_LABEL_KEY, scope_enter, scope_exit
from airstream.options.config import CompilerConfig
from airstream.torch_internals import module_stack

__all__ = ["MoE", "format_moe", "run_moe", "split_experts"]


class Expert(torch.nn.Module):
    """Linear(H, 4H) -> GELU -> Linear(4H, H)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(hidden, 4 * hidden)
        self.down = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(x)))


class MoE(torch.nn.Module):
    """Every expert on every token, outputs summed."""

    def __init__(self, experts: int, hidden: int) -> None:
        super().__init__()
        self.experts = torch.nn.ModuleList(Expert(hidden) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [expert(x) for expert in self.experts]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total


def _expert_index(node: torch.fx.Node, pattern: re.Pattern[str]) -> int | None:
    for path, _ in module_stack(node).values():
        match = pattern.search(str(path))
        if match:
            return int(match.group(1))
    return None


def split_experts(num_streams: int = 2, pattern: str = r"experts\.(\d+)") -> Callable[..., None]:
    """A pass putting expert ``i`` on stream ``moe_{i % num_streams}`` (stream 0 is main).

    Each maximal run of consecutive nodes bound for one side stream is wrapped in one
    ``scope_enter``/``scope_exit`` pair; the planner adds the syncs.
    """
    regex = re.compile(pattern)

    def split_experts_pass(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any
    ) -> None:
        graph = gm.graph
        runs: list[tuple[str, list[torch.fx.Node]]] = []
        for node in graph.nodes:
            index = _expert_index(node, regex) if node.op == "call_function" else None
            label = (
                None if index is None or index % num_streams == 0 else f"moe_{index % num_streams}"
            )
            if label is None:
                continue
            if runs and runs[-1][0] == label and runs[-1][1][-1].next is node:
                runs[-1][1].append(node)
            else:
                runs.append((label, [node]))
        for label, nodes in runs:
            with graph.inserting_before(nodes[0]):
                graph.call_function(scope_enter, ([STREAM_LABEL_KEY], [label]))
            with graph.inserting_after(nodes[-1]):
                graph.call_function(scope_exit, ())

    return split_experts_pass


def _hand_threads(model: MoE, x: torch.Tensor) -> Callable[[], torch.Tensor]:
    """Odd experts on a fresh Python thread, even ones on the caller's, then the sum."""
    experts = list(model.experts)
    odd: list[torch.Tensor] = []

    def side() -> None:
        torch.set_num_threads(1)
        with torch.no_grad():
            odd.extend(expert(x) for expert in experts[1::2])

    def run() -> torch.Tensor:
        odd.clear()
        thread = threading.Thread(target=side)
        thread.start()
        even = [expert(x) for expert in experts[0::2]]
        thread.join()
        outs = [o for pair in zip(even, odd, strict=True) for o in pair]
        total = outs[0]
        for out in outs[1:]:
            total = total + out
        return total

    return run


def run_moe(
    experts: int = 8,
    tokens: int = 8,
    hidden: int = 1024,
    rounds: int = 15,
    calls: int = 5,
    inductor: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Time the runners; return medians (ms) and ratios, checked against eager first.

    On a CUDA ``device`` every timed call ends with a synchronize; the hand-written threads and
    the 1-thread eager runner (CPU figures) are left out there."""
    default_threads = torch.get_num_threads()
    cuda = device.startswith("cuda")
    torch.manual_seed(0)
    model = MoE(experts, hidden).eval().to(device)
    x = torch.randn(tokens, hidden, device=device)
    single_backend = get_backend(CompilerConfig())
    single = torch.compile(model, backend=single_backend)
    config = CompilerConfig()
    config.post_grad_custom_pre_pass = split_experts(2)
    backend = get_backend(config)
    multi = torch.compile(model, backend=backend)
    candidates: dict[str, Callable[[], Any]] = {
        f"eager ({default_threads} threads)": with_threads(default_threads, lambda: model(x)),
    }
    if not cuda:
        candidates["eager (1 thread)"] = with_threads(1, lambda: model(x))
    if inductor:
        compiled = torch.compile(model)
        candidates["inductor"] = with_threads(default_threads, lambda: compiled(x))
    # What a user gets on one stream: torch's default intra-op threads (the 2-stream runner's
    # streams run with one each, which the runtime sets itself).
    candidates["airstream 1 stream"] = with_threads(default_threads, lambda: single(x))
    # The runtime sets the caller's intra-op threads itself; run it from the default setting.
    candidates["airstream 2 streams"] = with_threads(default_threads, lambda: multi(x))
    if experts % 2 == 0 and not cuda:
        candidates["hand-written threads"] = with_threads(1, _hand_threads(model, x))
    candidates = {name: synchronized(device, fn) for name, fn in candidates.items()}
    with torch.no_grad():
        want = model(x)
    medians = checked_medians(candidates, want, rounds=rounds, calls_per_round=calls)
    plan = backend.graphs[-1].plan
    baseline = min(
        t
        for name, t in medians.items()
        if name.startswith(("eager (", "inductor")) and "1 thread" not in name
    )
    verdict = never_slower(
        {name: t * 1e3 for name, t in medians.items()},
        configs=("airstream 1 stream", "airstream 2 streams"),
        baselines=(f"eager ({default_threads} threads)", "inductor"),
        ceiling=(f"eager ({default_threads} threads)", "hand-written threads"),
    )
    return {
        "benchmark": "moe",
        "never_slower": verdict,
        "experts": experts,
        "tokens": tokens,
        "hidden": hidden,
        "dtype": "float32",
        **run_conditions(rounds, calls, device),
        "plan": plan.summary(),
        "cuda_graphs": cuda_graphs(
            {"airstream 1 stream": single_backend, "airstream 2 streams": backend}
        ),
        "ms": {name: t * 1e3 for name, t in medians.items()},
        "speedup_2_streams_vs_best_default": baseline / medians["airstream 2 streams"],
        "speedup_2_streams_vs_1_stream": medians["airstream 1 stream"]
        / medians["airstream 2 streams"],
        "speedup_hand_threads_vs_eager_1_thread": (
            medians["eager (1 thread)"] / medians["hand-written threads"]
            if "hand-written threads" in medians and "eager (1 thread)" in medians
            else None
        ),
    }


def format_moe(report: dict[str, Any]) -> str:
    """The report as a table."""
    fastest = min(report["ms"].values())
    lines = [
        f"moe: E={report['experts']} experts, B={report['tokens']} tokens, H={report['hidden']}, "
        f"{report['dtype']}; {report['device']}, {report['cores']} cores, torch {report['torch']}; "
        f"{report['rounds']} interleaved rounds x {report['calls_per_round']} calls, medians",
        f"{'runner':<24}{'ms':>9}{'vs fastest':>12}",
    ]
    for name, ms in report["ms"].items():
        lines.append(f"{name:<24}{ms:>9.2f}{ms / fastest:>11.2f}x")
    lines.append(
        f"2 streams vs best of eager(default threads)/inductor: "
        f"{report['speedup_2_streams_vs_best_default']:.2f}x; "
        f"vs airstream 1 stream: {report['speedup_2_streams_vs_1_stream']:.2f}x"
    )
    if report["speedup_hand_threads_vs_eager_1_thread"] is not None:
        lines.append(
            "ceiling on this machine (hand-written threads vs eager 1 thread): "
            f"{report['speedup_hand_threads_vs_eager_1_thread']:.2f}x"
        )
    lines.append(
        never_slower_line(
            report["never_slower"],
            "runners interleaved in one process, warm, medians",
        )
    )
    for runner, statuses in report.get("cuda_graphs", {}).items():
        lines.append(f"{runner}: CUDA graph {', '.join(statuses)}")
    lines.append("plan of the 2-stream graph:\n" + report["plan"])
    return "\n".join(lines)
