"""``airstream bench tp --nproc 2``: a tensor-parallel MLP stack over torch.distributed (gloo).

Each layer: column-parallel ``Linear(H, 4H)`` (each rank holds ``4H / world`` output rows), GELU,
row-parallel ``Linear(4H, H)`` whose partial sums are all-reduced (Megatron's split), plus a second,
independent branch ``GELU(Linear(H, H))`` on the layer input (replicated), added to the result.
The collectives are ``torch.distributed._functional_collectives`` wrapped in autograd functions
(all_reduce forward / identity backward, and its mirror on the input), so Dynamo captures them in
the graph and a training step works.

The benchmark spawns ``nproc`` ranks on this machine (gloo over localhost, 1 intra-op thread per
rank), checks each runner against a single-process reference, and times, interleaved, with
medians: eager, airstream on one stream, and airstream with ``passes.overlap_communication()``
(the collective, its wait and the MLP that only it needs on stream ``comm``, so the branch runs
meanwhile) and with ``overlap_communication(producers=False)`` (only the collective and its wait
move: main computes the branch while ``comm`` waits for the sum).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

from airstream.bench.ranks import run_ranks
from airstream.bench.timing import run_conditions
from airstream.torch_internals import functional_collectives

__all__ = ["TPModel", "TPReference", "format_tp", "layer_weights", "run_tp"]

funcol = functional_collectives()  # torch.distributed._functional_collectives


class _AllReduce(torch.autograd.Function):
    """Sum over ranks forward; identity backward (the row-parallel output)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(x, "sum", dist.group.WORLD)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _ToParallel(torch.autograd.Function):
    """Identity forward; sum over ranks backward (the column-parallel input)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(grad, "sum", dist.group.WORLD)


def layer_weights(layer: int, hidden: int) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of layer ``layer``, the same on every rank."""
    gen = torch.Generator().manual_seed(1000 + layer)
    scale = hidden**-0.5

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    return {
        "w1": rand(4 * hidden, hidden),
        "b1": rand(4 * hidden),
        "w2": rand(hidden, 4 * hidden),
        "b2": rand(hidden),
        "wb": rand(hidden, hidden),
        "bb": rand(hidden),
    }


class TPLayer(torch.nn.Module):
    """One layer's shard on ``rank`` of ``world`` (``comm=False``: its compute alone, the
    collectives left out, for the time communication adds)."""

    def __init__(
        self, full: dict[str, torch.Tensor], rank: int, world: int, comm: bool = True
    ) -> None:
        super().__init__()
        self.comm = comm
        rows = full["w1"].shape[0] // world
        part = slice(rank * rows, (rank + 1) * rows)
        self.w1 = torch.nn.Parameter(full["w1"][part].clone())
        self.b1 = torch.nn.Parameter(full["b1"][part].clone())
        self.w2 = torch.nn.Parameter(full["w2"][:, part].clone())
        self.b2 = torch.nn.Parameter(full["b2"].clone())
        self.branch = torch.nn.Linear(full["wb"].shape[1], full["wb"].shape[0])
        with torch.no_grad():
            self.branch.weight.copy_(full["wb"])
            self.branch.bias.copy_(full["bb"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(
            torch.nn.functional.linear(_ToParallel.apply(x) if self.comm else x, self.w1, self.b1)
        )
        partial = torch.nn.functional.linear(h, self.w2)
        mlp = (_AllReduce.apply(partial) if self.comm else partial) + self.b2
        return mlp + torch.nn.functional.gelu(self.branch(x))


class TPModel(torch.nn.Module):
    """``layers`` tensor-parallel layers: this rank's shards."""

    def __init__(self, layers: int, hidden: int, rank: int, world: int, comm: bool = True) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(
            TPLayer(layer_weights(i, hidden), rank, world, comm) for i in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class TPReference(torch.nn.Module):
    """The same stack in one process with the full weights."""

    def __init__(self, layers: int, hidden: int) -> None:
        super().__init__()
        self.weights = [layer_weights(i, hidden) for i in range(layers)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.nn.functional
        for w in self.weights:
            mlp = f.linear(f.gelu(f.linear(x, w["w1"], w["b1"])), w["w2"], w["b2"])
            x = mlp + f.gelu(f.linear(x, w["wb"], w["bb"]))
        return x


def _rank_bench(
    rank: int, world: int, layers: int, tokens: int, hidden: int, rounds: int, calls: int
) -> dict[str, Any]:
    from airstream.backend import get_backend
    from airstream.bench.timing import checked_medians
    from airstream.debug.profile import profile
    from airstream.options.config import CompilerConfig
    from airstream.passes.auto.overlap import overlap_communication

    torch.manual_seed(0)
    model = TPModel(layers, hidden, rank, world).eval()
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(7))
    runners: dict[str, Any] = {"eager": lambda: model(x)}
    backends = {}
    for name, graph_pass in {
        "airstream 1 stream": None,
        "airstream overlap_communication": overlap_communication(),
        "airstream overlap_communication(producers=False)": overlap_communication(producers=False),
    }.items():
        config = CompilerConfig()
        config.post_grad_custom_pre_pass = graph_pass
        backend = get_backend(config)
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        runners[name] = lambda c=compiled: c(x)
        backends[name] = backend
    with torch.no_grad():
        want = TPReference(layers, hidden)(x)
    medians = checked_medians(runners, want, rounds=rounds, calls_per_round=calls, settle=1)
    profiles = {}
    for name in backends:  # one profiled call each: where the time goes
        with torch.no_grad(), profile() as prof:
            runners[name]()
        comm_wait = sum(
            r.end_ns - r.start_ns for r in prof.events if r.name.startswith("wait_tensor")
        )
        profiles[name] = {
            "wall_us": prof.wall_ns / 1e3,
            "wait_tensor_us": comm_wait / 1e3,
            "streams": {
                str(label): {"busy_us": st.busy_ns / 1e3, "blocked_us": st.blocked_ns / 1e3}
                for label, st in prof.stats().items()
            },
        }
    return {
        "ms": {k: v * 1e3 for k, v in medians.items()},
        "streams": {
            name: sorted(str(s.label) for s in b.graphs[-1].plan.streams if s.runs)
            for name, b in backends.items()
        },
        "profiles": profiles,
    }


def run_tp(
    nproc: int = 2,
    layers: int = 4,
    tokens: int = 64,
    hidden: int = 256,
    rounds: int = 11,
    calls: int = 10,
) -> dict[str, Any]:
    """Spawn ``nproc`` gloo ranks, time the runners on each; rank 0's figures and the others'."""
    params = {
        "layers": layers,
        "tokens": tokens,
        "hidden": hidden,
        "rounds": rounds,
        "calls": calls,
    }
    by_rank = run_ranks(nproc, functools.partial(_rank_bench, **params), what="bench tp")
    base = by_rank[0]["ms"]["airstream 1 stream"]
    return {
        "benchmark": "tp",
        "nproc": nproc,
        "layers": layers,
        "tokens": tokens,
        "hidden": hidden,
        **run_conditions(rounds, calls),
        "ms": by_rank[0]["ms"],
        "ms_by_rank": {r: rep["ms"] for r, rep in sorted(by_rank.items())},
        "speedup_vs_1_stream": {k: base / v for k, v in by_rank[0]["ms"].items()},
        "streams": by_rank[0]["streams"],
        "profiles_rank0": by_rank[0]["profiles"],
    }


def format_tp(report: dict[str, Any]) -> str:
    """The report as a table, then rank 0's profile of one call of each airstream runner."""
    lines = [
        f"tp: {report['nproc']} ranks (gloo, localhost, 1 intra-op thread each), "
        f"{report['layers']} layers, B={report['tokens']}, H={report['hidden']}; "
        f"{report['cores']} cores, torch {report['torch']}; {report['rounds']} interleaved rounds "
        f"x {report['calls_per_round']} calls, medians (rank 0)",
        f"{'runner':<52}{'ms':>9}{'vs 1 stream':>13}",
    ]
    for name, ms in report["ms"].items():
        lines.append(f"{name:<52}{ms:>9.2f}{report['speedup_vs_1_stream'][name]:>12.2f}x")
    lines.append(
        "rank 0, one profiled call each (airstream.profile): wall, time inside the collectives' "
        "wait_tensor, and per stream busy / blocked (us):"
    )
    for name, prof in report["profiles_rank0"].items():
        streams = ", ".join(
            f"{label if label != 'None' else 'main'} {st['busy_us']:.0f}/{st['blocked_us']:.0f}"
            for label, st in prof["streams"].items()
        )
        lines.append(
            f"  {name:<50} wall {prof['wall_us']:>7.0f}  wait_tensor {prof['wait_tensor_us']:>6.0f}"
            f"  {streams}"
        )
    return "\n".join(lines)
