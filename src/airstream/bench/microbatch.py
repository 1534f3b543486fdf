"""``airstream bench microbatch``: ``passes.microbatch_overlap()`` against the unsplit graph and a
hand-written split, over a sweep of token counts.

Each reference model (:mod:`airstream.bench.microbatch_models`: a tensor-parallel MLP stack of
``layers`` layers, ``tp``, and an expert-parallel MoE stack of ``layers // 2`` layers with a
shared expert, ``moe``: as many collectives, two a layer; experts ``2 x nproc``, top 2) runs on
``nproc`` gloo ranks over localhost (1 intra-op thread each), or, with ``comm="modelled"``, in one
process whose collectives are modelled delays (:mod:`airstream.bench.modelled_comm`: ``alpha +
beta * bytes``, the GIL released: the schedule apart from this machine's copy contention). For
each token count, interleaved rounds with medians (the slowest rank's: a step takes as long as
its slowest rank) of:

* ``hand unsplit`` and ``hand split``: the model written by hand in eager PyTorch Domino-style
  (each micro-batch a generator that yields after issuing a collective with ``async_op=True``;
  two micro-batches advanced in turn wait one stage late), on the whole batch as one
  micro-batch and split in two: the hand split's gain is over the same code unsplit;
* ``unsplit``, ``pass`` and ``pass, measured``: airstream (``dynamic=True``, one graph for every
  size) without the pass, with it always kept (``measure_placement=False``), and with it measured
  against the unsplit graph per size range (the default), whose decision the report gives;
* ``compute alone`` (by hand and airstream): the same models with the collectives left out, so
  that each runner's exposed communication is its time minus its family's compute alone.

Every runner's output is checked against the eager model's (rtol 1e-5) before timing. Two
micro-batches leave the last collective of the second exposed (nothing follows to hide it): of
``2 x layers`` collectives of half the size, one, so at most ``1 - 1 / (2 x layers)`` of the
communication can be hidden (with a collective per layer).
"""

from __future__ import annotations

import functools
import itertools
import statistics
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from airstream.bench.ranks import run_in_child, run_ranks
from airstream.bench.timing import MEASURING_CALLS, run_conditions

__all__ = ["MICROBATCH_MODELS", "SIZES", "format_microbatch", "run_microbatch"]

_FREE = " (comm free)"  # a runner timed with modelled communication that costs nothing
_OWN_COMPUTE = ("hand unsplit", "hand split", "unsplit", "pass")

SIZES = (16, 64, 256, 1024, 4096, 8192)
MICROBATCH_MODELS = ("tp", "moe")
_RTOL = 1e-5


def _model(name: str, layers: int, hidden: int, rank: int, world: int, comm: bool) -> Any:
    from airstream.bench.microbatch_models import EPMoE
    from airstream.bench.tp import TPModel

    if name == "tp":
        return TPModel(layers, hidden, rank, world, comm=comm).eval()
    if name == "moe":  # two collectives a layer: half the layers, as many collectives
        experts, moe_layers = 2 * world, max(1, layers // 2)
        return torch.nn.Sequential(
            *(EPMoE(hidden, 2 * hidden, experts, 2, rank, world, comm) for _ in range(moe_layers))
        ).eval()
    raise ValueError(f"bench microbatch: no model {name!r}; choose from {MICROBATCH_MODELS}")


# --- the hand-written split -------------------------------------------------------------------


def _tp_micro(model: Any, x: torch.Tensor) -> Generator[None, None, torch.Tensor]:
    """One micro-batch of the TP stack: yields after issuing each layer's all-reduce."""
    functional = torch.nn.functional
    for layer in model.layers:
        h = functional.gelu(functional.linear(x, layer.w1, layer.b1))
        partial = functional.linear(h, layer.w2)
        work = dist.all_reduce(partial, async_op=True) if layer.comm else None
        branch = functional.gelu(layer.branch(x))
        yield
        if work is not None:
            work.wait()
        x = partial + layer.b2 + branch
    return x


def _moe_micro(model: Any, x: torch.Tensor) -> Generator[None, None, torch.Tensor]:
    """One micro-batch of the EP MoE stack: yields after issuing each all-to-all."""
    functional = torch.nn.functional
    for layer in model:
        tokens, hidden = x.shape
        world, k = layer.world, layer.top_k
        send = x.unsqueeze(0).expand(world, tokens, hidden).reshape(world * tokens, hidden)
        recv = torch.empty_like(send)
        work = dist.all_to_all_single(recv, send, async_op=True) if layer.comm else None
        shared = functional.gelu(x @ layer.s1) @ layer.s2
        yield
        if work is not None:
            work.wait()
        else:
            recv = send
        weights, ids = torch.topk(torch.softmax(recv @ layer.router.t(), dim=-1), k, dim=-1)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        rows = order // k
        picked, expert = recv[rows], flat[order]
        gate = weights.reshape(-1)[order].unsqueeze(-1)
        out = torch.zeros_like(picked)
        for e in range(layer.w1.shape[0]):
            mine = (expert == layer.first + e).unsqueeze(-1).to(x.dtype)
            out = out + functional.gelu(picked @ layer.w1[e]) @ layer.w2[e] * mine
        combined = torch.zeros_like(recv).index_add(0, rows, out * gate)
        back = torch.empty_like(combined)
        work = dist.all_to_all_single(back, combined, async_op=True) if layer.comm else None
        yield
        if work is not None:
            work.wait()
        else:
            back = combined
        x = back.reshape(world, tokens, hidden).sum(0) + shared
    return x


def hand_split(model: Any, x: torch.Tensor, name: str, parts: int = 2) -> torch.Tensor:
    """``model(x)`` as ``parts`` micro-batches advanced in turn (Domino / two-batch overlap;
    ``parts=1``: the same code unsplit, each collective waited for at once)."""
    micro = _tp_micro if name == "tp" else _moe_micro
    bounds = [x.shape[0] * i // parts for i in range(parts + 1)]
    gens: list[Iterator[None]] = [micro(model, x[a:b]) for a, b in itertools.pairwise(bounds)]
    outs: list[torch.Tensor | None] = [None] * parts
    while any(o is None for o in outs):
        for i, gen in enumerate(gens):
            if outs[i] is not None:
                continue
            try:
                next(gen)
            except StopIteration as done:
                outs[i] = done.value
    return torch.cat([o for o in outs if o is not None])


# --- one rank ---------------------------------------------------------------------------------


def _runners(name: str, layers: int, hidden: int, rank: int, world: int) -> dict[str, Any]:
    from airstream.backend import get_backend
    from airstream.options.config import CompilerConfig
    from airstream.passes.auto.microbatch import microbatch_overlap

    model = _model(name, layers, hidden, rank, world, comm=True)
    alone = _model(name, layers, hidden, rank, world, comm=False)
    backends = {}
    compiled = {}
    for label, graph_pass, measured, target in (
        ("unsplit", None, False, model),
        ("pass", microbatch_overlap(), False, model),
        ("pass, measured", microbatch_overlap(), True, model),
        ("compute alone", None, False, alone),
    ):
        config = CompilerConfig()
        config.post_grad_custom_pre_pass = graph_pass
        config.stream_config.measure_placement = "auto" if measured else False
        backends[label] = get_backend(config)
        compiled[label] = torch.compile(target, backend=backends[label], dynamic=True)
    return {
        "eager": model,
        "runners": {
            "hand unsplit": lambda x: hand_split(model, x, name, parts=1),
            "hand split": lambda x: hand_split(model, x, name),
            "hand compute alone": lambda x: hand_split(alone, x, name, parts=1),
            **compiled,
        },
        "measured": backends["pass, measured"],
    }


def _ranks() -> bool:
    """Whether there are other processes (gloo ranks; a modelled group is this one alone)."""
    return dist.is_initialized() and dist.get_backend() == "gloo" and dist.get_world_size() > 1


def _slowest(values: list[float]) -> list[float]:
    """Each value's maximum over the ranks (one rank: as they are)."""
    if not _ranks():
        return values
    found = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(found, op=dist.ReduceOp.MAX)
    return [float(v) for v in found.tolist()]


def _barrier() -> None:
    if _ranks():
        dist.barrier()


def bench_rank(
    rank: int,
    world: int,
    models: Sequence[str],
    sizes: Sequence[int],
    layers: int,
    hidden: int,
    rounds: int,
    calls: int,
    modelled: Any = None,
) -> dict[str, Any]:
    """This rank's figures for every model and size (the slowest rank's, once agreed);
    ``modelled``: the modelled group (:mod:`airstream.bench.modelled_comm`), whose runners are
    timed again with free communication (``scale`` 0): each one's own compute alone."""
    torch.manual_seed(0)
    out: dict[str, Any] = {}
    for name in models:
        made = _runners(name, layers, hidden, rank, world)
        runners, measured, eager = made["runners"], made["measured"], made["eager"]
        per_size: dict[str, Any] = {}
        for tokens in sizes:
            x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(rank))
            with torch.no_grad():
                want = eager(x)
                errors = {}
                for label, run in runners.items():
                    for _ in range(MEASURING_CALLS * 3 // 2 if label == "pass, measured" else 2):
                        got = run(x)  # warm: the measured runner decides here
                    if "alone" not in label:
                        scale = float(want.abs().max())
                        errors[label] = float((got - want).abs().max()) / max(scale, 1e-30)
                        if errors[label] > _RTOL:
                            raise RuntimeError(
                                f"bench microbatch: {name} {label!r} differs from eager by "
                                f"{errors[label]:.1e} of its largest value at {tokens} tokens"
                            )
                timed = [(label, run, 1.0) for label, run in runners.items()]
                if modelled is not None:
                    timed += [(f"{k}{_FREE}", runners[k], 0.0) for k in _OWN_COMPUTE]
                samples: dict[str, list[float]] = {k: [] for k, _, _ in timed}
                comm: dict[str, list[float]] = {k: [] for k, _, _ in timed}
                for _ in range(rounds):
                    for label, run, scale in timed:
                        _barrier()
                        if modelled is not None:
                            modelled.scale = scale
                        before = modelled.carried if modelled is not None else 0.0
                        start = time.perf_counter()
                        for _ in range(calls):
                            run(x)
                        samples[label].append((time.perf_counter() - start) / calls)
                        if modelled is not None:
                            comm[label].append((modelled.carried - before) / calls)
                if modelled is not None:
                    modelled.scale = 1.0
            labels = list(samples)
            medians = _slowest([statistics.median(samples[k]) for k in labels])
            graphs = [g for g in measured.graphs if g.measurement is not None]
            decision = graphs[-1].measurement.describe() if graphs else ""
            per_size[str(tokens)] = {
                "ms": {k: 1e3 * v for k, v in zip(labels, medians, strict=True)},
                "max_rel_error": errors,
                "decision": decision,
                "modelled_comm_ms": {k: 1e3 * statistics.median(v) for k, v in comm.items() if v}
                or None,
            }
        out[name] = per_size
    return out


def _modelled_main(world: int, alpha: float, beta: float, params: dict[str, Any]) -> Any:
    from airstream.bench.modelled_comm import init_modelled

    group = init_modelled(world, alpha, beta)
    try:
        return bench_rank(0, world, modelled=group, **params)
    finally:
        dist.destroy_process_group()


def run_microbatch(
    nproc: int = 2,
    models: Sequence[str] = MICROBATCH_MODELS,
    sizes: Sequence[int] = SIZES,
    layers: int = 4,
    hidden: int = 256,
    rounds: int = 5,
    calls: int = 2,
    comm: str = "gloo",
    alpha_us: float = 50.0,
    beta_ns_per_byte: float = 4.0,
) -> dict[str, Any]:
    """Spawn the ranks (``comm="gloo"``: ``nproc`` processes; ``"modelled"``: one process
    modelling ``nproc`` ranks) and collect the report."""
    params: dict[str, Any] = {
        "models": tuple(models),
        "sizes": tuple(sizes),
        "layers": layers,
        "hidden": hidden,
        "rounds": rounds,
        "calls": calls,
    }
    what = "bench microbatch"
    if comm == "gloo":
        each = functools.partial(bench_rank, **params)
        by_rank = run_ranks(nproc, each, timeout_s=3600, what=what)
    elif comm == "modelled":
        model = (nproc, alpha_us * 1e-6, beta_ns_per_byte * 1e-9, params)
        by_rank = {0: run_in_child(_modelled_main, *model, timeout_s=3600, what=what)}
    else:
        raise ValueError(f"bench microbatch: comm must be 'gloo' or 'modelled', got {comm!r}")
    return {
        "benchmark": "microbatch",
        "comm": comm,
        "nproc": nproc,
        "layers": layers,
        "hidden": hidden,
        "alpha_us": alpha_us if comm == "modelled" else None,
        "beta_ns_per_byte": beta_ns_per_byte if comm == "modelled" else None,
        **run_conditions(rounds, calls),
        "models": summarize(by_rank[0]),
    }


def summarize(figures: dict[str, Any]) -> dict[str, Any]:
    """Per model and size: the medians, each runner's gain over its own unsplit baseline, its
    exposed communication, the hidden share (modelled) and the crossover sizes."""
    out: dict[str, Any] = {}
    for name, per_size in figures.items():
        rows = {}
        for tokens, fig in per_size.items():
            ms = fig["ms"]
            exposed = {
                "hand unsplit": ms["hand unsplit"] - ms["hand compute alone"],
                "hand split": ms["hand split"] - ms["hand compute alone"],
                "unsplit": ms["unsplit"] - ms["compute alone"],
                "pass": ms["pass"] - ms["compute alone"],
                "pass, measured": ms["pass, measured"] - ms["compute alone"],
            }
            row = {
                **fig,
                "hand_gain": ms["hand unsplit"] / ms["hand split"],
                "pass_gain": ms["unsplit"] / ms["pass"],
                "measured_gain": ms["unsplit"] / ms["pass, measured"],
                "exposed_ms": exposed,
            }
            comm = fig.get("modelled_comm_ms")
            if comm:  # the share of its own communication each runner's compute hid
                own = {k: ms[k] - ms[f"{k}{_FREE}"] for k in _OWN_COMPUTE}
                row["own_exposed_ms"] = own
                row["hidden_share"] = {k: 1 - own[k] / comm[k] for k in _OWN_COMPUTE}
            rows[tokens] = row
        pays = [int(t) for t, r in rows.items() if r["hand_gain"] > 1.0]
        passes = [int(t) for t, r in rows.items() if r["pass_gain"] > 1.0]
        out[name] = {
            "sizes": rows,
            "hand_split_pays_from": min(pays) if pays else None,
            "pass_pays_from": min(passes) if passes else None,
        }
    return out


def format_microbatch(report: dict[str, Any]) -> str:
    """The report as one table per model."""
    comm = report["comm"]
    where = (
        f"{report['nproc']} gloo ranks over localhost (1 intra-op thread each)"
        if comm == "gloo"
        else f"1 process modelling {report['nproc']} ranks: alpha {report['alpha_us']} us, "
        f"beta {report['beta_ns_per_byte']} ns/byte"
    )
    lines = [
        f"microbatch: {where}; {report['layers']} layers, H={report['hidden']}; "
        f"{report['cores']} cores, torch {report['torch']}; {report['rounds']} interleaved rounds "
        f"x {report['calls_per_round']} calls, medians (slowest rank), ms",
    ]
    for name, model in report["models"].items():
        lines.append(f"{name}:")
        head = (
            f"{'tokens':>7}{'by hand':>9}{'split':>9}{'gain':>7}{'unsplit':>9}{'pass':>9}"
            f"{'gain':>7}{'measured':>10}{'gain':>7}{'exposed unsplit/pass':>22}"
        )
        if comm == "modelled":
            head += f"{'comm':>8}{'hidden: hand':>14}{'pass':>6}"
        lines.append(head)
        for tokens, r in model["sizes"].items():
            ms, ex = r["ms"], r["exposed_ms"]
            line = (
                f"{tokens:>7}{ms['hand unsplit']:>9.2f}{ms['hand split']:>9.2f}"
                f"{r['hand_gain']:>6.2f}x"
                f"{ms['unsplit']:>9.2f}{ms['pass']:>9.2f}{r['pass_gain']:>6.2f}x"
                f"{ms['pass, measured']:>10.2f}{r['measured_gain']:>6.2f}x"
                f"{ex['unsplit']:>11.2f}/{ex['pass']:<10.2f}"
            )
            if comm == "modelled":
                hid = r["hidden_share"]
                line += f"{r['modelled_comm_ms']['pass']:>8.2f}"
                line += f"{hid['hand split']:>14.0%}{hid['pass']:>6.0%}"
            lines.append(line)
        for tokens, r in model["sizes"].items():
            lines.append(f"  {tokens}: measured {r['decision'] or '(not measured)'}")
        lines.append(
            f"  the hand split pays from {model['hand_split_pays_from']} tokens, the pass from "
            f"{model['pass_pays_from']}"
        )
    return "\n".join(lines)
