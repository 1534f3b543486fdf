"""A differential fuzzer for ``passes.microbatch_overlap()``: random programs
(:mod:`airstream.selftest.microbatch_programs`) compiled with the pass forced on (not measured),
against eager PyTorch on the same inputs, in float64.

:func:`check_program` runs one program: a static graph at one token count, a dynamic one
compiled once and called at each of its counts, in inference or training (gradients of every
input and parameter compared too), and classifies the outcome; :func:`run_microbatch_fuzz`
draws and checks many, on one rank or on two gloo ranks (eager collectives pair across the
ranks, so each rank's eager run is its reference); :func:`format_report` sums a run up.
"""

from __future__ import annotations

import os
import queue
import random
import socket
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import airstream
from airstream.passes.auto.microbatch import UNSPLIT_KEY
from airstream.selftest.microbatch_draw import draw_program
from airstream.selftest.microbatch_programs import MicrobatchProgram, build_module, make_inputs
from airstream.selftest.microbatch_report import (
    KINDS,
    Outcome,
    build_report,
    crash_class,
    reason_class,
)
from airstream.torch_internals import autograd_cache_off, compiled_frames, reset_dynamo

__all__ = ["check_program", "run_microbatch_fuzz"]

Agree = Callable[[bool], bool]  # True where any rank says True (keeps the ranks in step)


def _compile(module: torch.nn.Module, mode: str, with_pass: bool, dynamic: bool) -> Any:
    config = airstream.CompilerConfig()
    config.mode = mode
    config.post_grad_custom_pre_pass = airstream.passes.microbatch_overlap() if with_pass else None
    config.stream_config.measure_placement = False  # the split is kept: forced, not measured
    backend = airstream.get_backend(config)
    return torch.compile(module, backend=backend, dynamic=dynamic), backend


def _run(fn: Any, module: torch.nn.Module, inputs: list[torch.Tensor], training: bool) -> list:
    """Outputs, then (training) the gradients of every float input and parameter of
    ``loss = sum(out * fixed random weights)``."""
    if not training:
        with torch.no_grad():
            return list(fn(*inputs))
    ins = [t.clone().requires_grad_() if t.is_floating_point() else t for t in inputs]
    outs = list(fn(*ins))
    leaves = [t for t in ins if t.requires_grad] + list(module.parameters())
    loss = [
        (o * torch.randn(o.shape, generator=torch.Generator().manual_seed(i), dtype=o.dtype)).sum()
        for i, o in enumerate(outs)
        if o.is_floating_point() and o.requires_grad
    ]
    if not loss:
        return outs
    grads = torch.autograd.grad(sum(loss), leaves, allow_unused=True)
    zeros = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, leaves, strict=True)]
    return outs + zeros


def _error(got: Sequence[Any], want: Sequence[Any], outputs: int) -> tuple[float, str]:
    """The largest error (relative to each value's largest entry, at least 1e-3) and where."""
    worst, where = 0.0, ""
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        what = f"output {i}" if i < outputs else f"gradient {i - outputs}"
        if g.shape != w.shape or g.dtype != w.dtype:
            return float("inf"), f"{what}: {g.dtype}{list(g.shape)}, eager {w.dtype}{list(w.shape)}"
        if not w.is_floating_point():
            err = float((g != w).any())
        elif (g.isnan() != w.isnan()).any():
            err = float("inf")
        else:
            finite = w.isfinite()
            diff = torch.where(g == w, 0.0, (g - w).abs()).nan_to_num(0.0, float("inf"))
            scale = max(float(w[finite].abs().max()) if finite.any() else 0.0, 1e-3)
            err = float(diff.max()) / scale if diff.numel() else 0.0
        if err > worst:
            worst, where = err, what
    return worst, where


def _calls(
    program: MicrobatchProgram, module: torch.nn.Module, compiled: Any, training: bool,
    tokens: Sequence[int], seed: int, agree: Agree, tolerance: float,
) -> Outcome | None:  # fmt: skip
    """Calls ``compiled`` at each token count against eager; the first failure, else None."""
    failure = None
    for i, count in enumerate(tokens):
        inputs = make_inputs(program, count, seed + 7919 * i)
        try:  # on copies: a program may write into its inputs
            want = _run(module, module, [t.clone() for t in inputs], training)
        except Exception as exc:
            failure = Outcome("invalid", crash_class(exc))
        if agree(failure is not None):
            return failure or Outcome("invalid", "on another rank")
        try:
            got = _run(compiled, module, inputs, training)
        except Exception as exc:
            failure = Outcome("crash", crash_class(exc))
        if agree(failure is not None):
            return failure or Outcome("crash", "on another rank")
        err, where = _error(got, want, len(program.outputs))
        if err > tolerance and failure is None:
            failure = Outcome("mismatch", f"{where} at {count} tokens: error {err:.3g}", err)
    return failure


def check_program(
    program: MicrobatchProgram,
    mode: str = "reduce-overhead",
    dynamic: bool | None = None,
    training: bool | None = None,
    tokens: Sequence[int] | None = None,
    *,
    seed: int = 0,
    agree: Agree | None = None,
    tolerance: float = 1e-9,
) -> Outcome:
    """Compile ``program`` with the pass forced on and compare it with eager PyTorch (``dynamic``,
    ``training`` and ``tokens`` default to the program's). A crash or mismatch is checked again
    without the pass: where that fails too, the outcome is ``baseline``. ``agree``: how the ranks
    of a group keep in step (each rank must check the same programs in the same order)."""
    dynamic = program.dynamic if dynamic is None else dynamic
    training = program.training if training is None else training
    tokens = tuple(program.tokens if tokens is None else tokens)
    spans = any(s[0] for spec in program.params for s in spec.shape)
    if spans and (dynamic or tokens != program.tokens[:1]):
        raise ValueError("a parameter spans the tokens: the program runs static, at its count")
    agree = agree or bool
    with (
        autograd_cache_off()
    ):  # every graph compiles here: a graph served by the cache runs no pass
        return _check(program, mode, dynamic, training, tokens, seed, agree, tolerance)


def _check(
    program: MicrobatchProgram,
    mode: str,
    dynamic: bool,
    training: bool,
    tokens: tuple[int, ...],
    seed: int,
    agree: Agree,
    tolerance: float,
) -> Outcome:
    module = build_module(program, seed=1)
    reset_dynamo()
    compiled, backend = _compile(module, mode, True, dynamic)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        failure = _calls(program, module, compiled, training, tokens, seed, agree, tolerance)
    compiles = compiled_frames()
    if agree(failure is not None and failure.kind in ("crash", "mismatch")):
        reset_dynamo()
        unsplit, _ = _compile(module, mode, False, dynamic)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = _calls(program, module, unsplit, training, tokens, seed, agree, tolerance)
        if failure is not None and again is not None:
            failure = Outcome("baseline", f"{failure.detail}; without the pass: {again.detail}")
    reset_dynamo()
    if failure is not None:
        return replace(failure, compiles=compiles)
    if any(UNSPLIT_KEY in g.graph_module.meta for g in backend.graphs):
        return Outcome("split", compiles=compiles)
    said = [str(w.message) for w in caught if str(w.message).startswith("microbatch_overlap")]
    detail = reason_class(said[0]) if said else ""
    return Outcome("refused" if said else "left_alone", detail, compiles=compiles)


def _check_all(
    programs: Sequence[MicrobatchProgram], rank: int, seed: int, mode: str, agree: Agree,
    progress: Callable[[int, MicrobatchProgram, Outcome], None] | None,
) -> list[Outcome]:  # fmt: skip
    torch.manual_seed(seed)
    found = []
    for i, program in enumerate(programs):
        data = (seed * 1_000_003 + i) * 8 + rank  # each rank's own input data
        found.append(check_program(program, mode, seed=data, agree=agree))
        if progress is not None:
            progress(i, program, found[-1])
    return found


def _agree_on(group: Any) -> Agree:
    def agree(flag: bool) -> bool:
        t = torch.tensor([int(flag)])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return bool(t.item())

    return agree


def _rank_main(
    rank: int, world: int, port: int, graphs: int, seed: int, mode: str, out: Any
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
        agree = _agree_on(dist.new_group(backend="gloo"))  # apart from the programs' collectives
        rng = random.Random(seed)
        programs = [draw_program(rng, world=world) for _ in range(graphs)]

        def progress(i: int, program: MicrobatchProgram, outcome: Outcome) -> None:
            out.put(("progress", rank, i, outcome))

        out.put(("done", rank, _check_all(programs, rank, seed, mode, agree, progress)))
    except BaseException as exc:
        out.put(("error", rank, "".join(traceback.format_exception(exc))[-3000:]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(
    world: int, graphs: int, seed: int, mode: str, timeout: float,
    progress: Callable[[int, Outcome], None],
) -> list[list[Outcome]]:  # fmt: skip
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = (world, port, graphs, seed, mode, out)
    procs = [ctx.Process(target=_rank_main, args=(r, *args), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    deadline, done = time.monotonic() + timeout, dict[int, list[Outcome]]()
    try:
        while len(done) < world:
            try:
                msg = out.get(timeout=1.0)
            except queue.Empty:
                gone = [r for r, p in enumerate(procs) if not p.is_alive() and r not in done]
                if gone:
                    code = procs[gone[0]].exitcode
                    raise RuntimeError(f"rank {gone[0]} exited ({code})") from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the ranks did not finish within {timeout:.0f} s") from None
                continue
            if msg[0] == "error":
                raise RuntimeError(f"rank {msg[1]} failed:\n{msg[2]}")
            if msg[0] == "done":
                done[msg[1]] = msg[2]
            elif msg[1] == 0:
                progress(msg[2], msg[3])
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [done[r] for r in range(world)]


def run_microbatch_fuzz(
    graphs: int,
    seed: int = 0,
    mode: str = "reduce-overhead",
    ranks: int = 1,
    progress: Callable[[int, MicrobatchProgram, Outcome], None] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Draw ``graphs`` programs from ``random.Random(seed)`` and check each; returns a report
    (:func:`format_report`). ``ranks=1`` runs here, on a 1-rank gloo group (made if none is);
    ``ranks=2`` spawns gloo ranks on localhost, each with its own input data, within
    ``timeout`` seconds (default ``120 + 20 * graphs``): a hang fails, it does not block."""
    start = time.perf_counter()
    rng = random.Random(seed)
    programs = [draw_program(rng, world=ranks) for _ in range(graphs)]
    if ranks == 1:
        own = not dist.is_initialized()
        if own:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            found = [_check_all(programs, 0, seed, mode, bool, progress)]
        finally:
            if own:
                dist.destroy_process_group()
    else:

        def relay(i: int, outcome: Outcome) -> None:
            if progress is not None:
                progress(i, programs[i], outcome)

        found = _spawn(ranks, graphs, seed, mode, timeout or 120 + 20 * graphs, relay)
    merged = [min(per, key=lambda o: KINDS.index(o.kind)) for per in zip(*found, strict=True)]
    return build_report(programs, merged, seed, mode, ranks, time.perf_counter() - start)
