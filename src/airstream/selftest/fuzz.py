"""A fuzzer for stream programs: random DAGs of aten ops on random streams (views and layout
changes among them), with random record/wait/wait_tensor edges, in-place input mutation and RNG
ops.

A program is plain data (:class:`Program`), drawn from any ``random.Random`` (hypothesis supplies
one in the tests, a seeded one in ``airstream selftest fuzz``). :func:`check_program` traces it,
plans it, and runs it many times through the CPU runtime and through the serial executor: results
and mutated inputs must be equal, and every run must finish within a timeout (a hang fails, it
does not block). :func:`break_program` makes an invalid variant that must raise StreamError.
:func:`check_program_max_autotune` runs a program with its segments compiled by Inductor
(max-autotune) against the same program on the aten path (reduce-overhead).
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from airstream.errors import StreamError
from airstream.graph.layouts import same_layout_as
from airstream.graph.streams import assign_streams
from airstream.ops.library import STREAM_LABEL_KEY
from airstream.runtime.cpu import CpuExecutor
from airstream.runtime.serial import SerialExecutor
from airstream.schedule.plan import build_plan

__all__ = [
    "FuzzHang",
    "Program",
    "break_program",
    "check_program",
    "check_program_max_autotune",
    "draw_program",
]

SHAPE = (4, 4)
STREAMS: tuple[str | None, ...] = (None, "f1", "f2", "f3")
UNARY = ("sin", "cos", "relu", "neg", "tanh", "sigmoid")
BINARY = ("add", "mul", "sub", "maximum", "mm")
# Ops that hand on a value in another layout than their input's, as attention does (heads
# transposed, GQA's expand, a KV cache grown by ``cat`` from empty, rotary embedding's halves):
# a transposed view, a broadcast row (stride 0), ``cat`` of an empty tensor (whose Inductor
# decomposition keeps its input's strides where aten's returns a contiguous tensor) and every
# other column of a fresh value twice as wide (a view with gaps).
LAYOUT: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "t": torch.t,
    "expand_row": lambda x: x[:1].expand(SHAPE),
    "cat_empty": lambda x: torch.cat([x.new_empty(SHAPE[0], 0), x], 1),
    "every_other": lambda x: torch.cat([x, -x], 1)[:, ::2],
}
_VIEWS = frozenset({"t", "expand_row"})  # the LAYOUT ops whose result shares its input's memory

air = torch.ops.air


class FuzzHang(AssertionError):
    """A run did not finish within the timeout."""


@dataclass(frozen=True)
class Step:
    """One instruction. ``kind``: op, rand, record, wait, wait_tensor, mutate."""

    kind: str
    stream: str | None
    name: str = ""
    args: tuple[int, ...] = ()


@dataclass(frozen=True)
class Program:
    """Inputs are values 0..inputs-1; each op/rand/wait_tensor step adds one value, each record
    one token (numbered separately); ``outputs`` are value indices."""

    inputs: int
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]

    def __str__(self) -> str:
        lines = [f"program with {self.inputs} inputs:"]
        lines += [f"  {s.kind} {s.name} {s.args} on {s.stream or 'main'}" for s in self.steps]
        lines.append(f"  return {self.outputs}")
        return "\n".join(lines)


def draw_program(rng: random.Random, max_steps: int = 14) -> Program:
    """A random valid program."""
    inputs = rng.randint(1, 3)
    values = inputs
    base = list(range(inputs))  # the value each value's memory belongs to (views share it)
    tokens = 0
    steps: list[Step] = []
    for _ in range(rng.randint(1, max_steps)):
        stream = rng.choice(STREAMS)
        roll = rng.random()
        if roll < 0.45:
            if rng.random() < 0.5:
                name = rng.choice(UNARY + tuple(LAYOUT))
                # half the time the newest value: chains such as t -> cat_empty -> sin
                arg = values - 1 if rng.random() < 0.5 else rng.randrange(values)
                steps.append(Step("op", stream, name, (arg,)))
                base.append(base[arg] if name in _VIEWS else values)
            else:
                pair = (rng.randrange(values), rng.randrange(values))
                steps.append(Step("op", stream, rng.choice(BINARY), pair))
                base.append(values)
            values += 1
        elif roll < 0.55:
            steps.append(Step("rand", stream))
            base.append(values)
            values += 1
        elif roll < 0.67:
            steps.append(Step("record", stream))
            tokens += 1
        elif roll < 0.79 and (tokens or values):
            deps: list[int] = []
            for _ in range(rng.randint(1, 2)):
                if tokens and rng.random() < 0.7:
                    deps.append(-1 - rng.randrange(tokens))  # a token, encoded negative
                else:
                    deps.append(rng.randrange(values))
            steps.append(Step("wait", stream, args=tuple(deps)))
        elif roll < 0.9:
            pair = (rng.randrange(values), rng.randrange(values))
            steps.append(Step("wait_tensor", stream, args=pair))
            base.append(base[pair[0]])
            values += 1
        else:
            target = rng.randrange(inputs)
            # eager refuses an in-place add whose source overlaps its target (x.add_(x.t()))
            sources = [v for v in range(values) if base[v] != target]
            if sources:
                steps.append(Step("mutate", stream, args=(target, rng.choice(sources))))
    outputs = sorted({values - 1, *(rng.randrange(values) for _ in range(rng.randint(0, 2)))})
    return Program(inputs, tuple(steps), tuple(outputs))


def _scoped(stream: str | None, fn: Callable[[], Any]) -> Any:
    if stream is None:
        return fn()
    air.scope_enter([STREAM_LABEL_KEY], [stream])
    try:
        return fn()
    finally:
        air.scope_exit()


def program_fn(program: Program) -> Callable[..., tuple[torch.Tensor, ...]]:
    """The program as a Python function of its input tensors (traced by make_fx)."""

    def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values: list[torch.Tensor] = list(inputs)
        tokens: list[torch.Tensor] = []
        for step in program.steps:
            if step.kind == "op":
                fn = LAYOUT.get(step.name) or getattr(torch, step.name)
                args = [values[i] for i in step.args]
                values.append(_scoped(step.stream, functools.partial(fn, *args)))
            elif step.kind == "rand":
                values.append(_scoped(step.stream, lambda: torch.rand(SHAPE)))
            elif step.kind == "record":
                tokens.append(_scoped(step.stream, lambda: air.record()))
            elif step.kind == "wait":
                deps = [tokens[-1 - i] if i < 0 else values[i] for i in step.args]
                _scoped(step.stream, functools.partial(air.wait, deps))
            elif step.kind == "wait_tensor":
                a, b = (values[i] for i in step.args)
                values.append(_scoped(step.stream, functools.partial(air.wait_tensor, a, b)))
            elif step.kind == "mutate":
                target, source = values[step.args[0]], values[step.args[1]]
                _scoped(step.stream, functools.partial(torch.Tensor.add_, target, source))
        return tuple(values[i] for i in program.outputs)

    return run


def _inputs(program: Program, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(SHAPE, generator=gen) for _ in range(program.inputs)]


def trace_program(program: Program) -> torch.fx.GraphModule:
    """The program's FX graph (fake-tensor tracing: metadata on every node)."""
    return make_fx(program_fn(program), tracing_mode="fake")(*_inputs(program, 0))


def _call_with_timeout(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="airstream-fuzz-call")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise FuzzHang(f"{what} did not finish within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


def check_program(program: Program, runs: int = 3, timeout: float = 20.0) -> None:
    """Trace, plan and run ``program``; the CPU runtime must equal the serial executor."""
    gm = trace_program(program)
    streams = assign_streams(gm)
    plan = build_plan(gm, streams)
    serial = SerialExecutor(gm, plan)
    parallel = CpuExecutor(gm, plan, 1) if any(s.runs for s in plan.side_streams) else serial
    for run in range(runs):
        seed = 7919 * run + 1
        ref_inputs = _inputs(program, seed)
        got_inputs = [t.clone() for t in ref_inputs]
        torch.manual_seed(seed)
        want = serial(list(ref_inputs))  # executors empty the list they get (boxed convention)
        torch.manual_seed(seed)
        got = _call_with_timeout(
            functools.partial(parallel, list(got_inputs)), timeout, f"run {run}"
        )
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=f"output {i}")
        for i, (g, w) in enumerate(zip(got_inputs, ref_inputs, strict=True)):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True, msg=f"input {i}")


def check_program_max_autotune(
    program: Program, runs: int = 2, timeout: float = 60.0, min_ops: int = 2
) -> int:
    """Run ``program`` with Inductor-compiled segments (max-autotune) and on the aten path;
    outputs and mutated inputs must agree to float32 tolerance (Inductor's vectorized math is
    not bit-equal to aten's), random values exactly. Returns how many segments were compiled."""
    from airstream.schedule.fuse import fuse_streams

    gm = trace_program(program)
    streams = assign_streams(gm)
    plan = build_plan(gm, streams)
    multi_ref = any(s.runs for s in plan.side_streams)
    reference: Any = CpuExecutor(gm, plan, 1) if multi_ref else SerialExecutor(gm, plan)
    fused_gm = trace_program(program)
    segments = fuse_streams(
        fused_gm,
        build_plan(fused_gm, assign_streams(fused_gm)),
        graph_kind="inference",
        min_ops=min_ops,
        strict=True,
    )
    fused_plan = build_plan(fused_gm, assign_streams(fused_gm))  # the fused graph, planned anew
    multi = any(s.runs for s in fused_plan.side_streams)
    fused = CpuExecutor(fused_gm, fused_plan, 1) if multi else SerialExecutor(fused_gm, fused_plan)
    for run in range(runs):
        seed = 7919 * run + 1
        ref_inputs = _inputs(program, seed)
        got_inputs = [t.clone() for t in ref_inputs]
        torch.manual_seed(seed)
        want = _call_with_timeout(
            functools.partial(reference, list(ref_inputs)), timeout, f"aten run {run}"
        )
        torch.manual_seed(seed)
        got = _call_with_timeout(
            functools.partial(fused, list(got_inputs)), timeout, f"fused run {run}"
        )
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            torch.testing.assert_close(g, w, equal_nan=True, msg=f"output {i}")
            if not same_layout_as(g, w):  # a caller sees the strides eager returns
                raise AssertionError(
                    f"output {i}: strides {g.stride()}, the aten path's {w.stride()}"
                )
        for i, (g, w) in enumerate(zip(got_inputs, ref_inputs, strict=True)):
            torch.testing.assert_close(g, w, equal_nan=True, msg=f"input {i}")
    return len(segments)


def break_program(gm: torch.fx.GraphModule, rng: random.Random) -> str:
    """Make ``gm`` invalid in place, in one of three ways; return which."""
    graph = gm.graph
    exits = [n for n in graph.nodes if n.target is air.scope_exit.default]
    enters = [n for n in graph.nodes if n.target is air.scope_enter.default]
    choice = rng.choice(["drop_exit", "drop_enter", "wait_on_size"])
    if choice == "drop_exit" and exits:
        graph.erase_node(rng.choice(exits))
        return choice
    if choice == "drop_enter" and enters:
        graph.erase_node(rng.choice(enters))
        return choice
    tensor = next(
        n for n in graph.nodes if isinstance(n.meta.get("val"), torch.Tensor) and n.op != "output"
    )
    with graph.inserting_after(tensor):
        size = graph.call_function(torch.ops.aten.sym_size.int, (tensor, 0))
        size.meta["val"] = SHAPE[0]
    with graph.inserting_after(size):
        graph.call_function(air.wait.default, ([size],))
    return "wait_on_size"


def check_invalid(program: Program, rng: random.Random) -> str:
    """Break a traced program; planning it must raise StreamError (never hang or crash)."""
    gm = trace_program(program)
    how = break_program(gm, rng)
    try:
        assign_streams(gm)
    except StreamError:
        return how
    raise AssertionError(f"{how}: no StreamError for an invalid program\n{program}")


def run_fuzz(
    cases: int, seed: int = 0, runs: int = 2, mode: str = "reduce-overhead"
) -> dict[str, Any]:
    """``cases`` valid programs checked and ``cases`` invalid ones; returns counts.

    ``mode="max-autotune"`` checks each valid program with Inductor-compiled segments against
    the aten path instead (and counts the segments compiled); segments of any length are
    compiled (``min_segment_ops=1``), so every op of every program goes through Inductor."""
    rng = random.Random(seed)
    stats: dict[str, Any] = {"valid": 0, "invalid": 0, "side_stream_programs": 0}
    stats["invalid_kinds"] = {}
    if mode == "max-autotune":
        stats["segments"] = 0
    for _ in range(cases):
        program = draw_program(rng)
        if mode == "max-autotune":
            stats["segments"] += check_program_max_autotune(program, runs=runs, min_ops=1)
        else:
            check_program(program, runs=runs)
        stats["valid"] += 1
        if any(s.stream is not None for s in program.steps):
            stats["side_stream_programs"] += 1
        how = check_invalid(program, rng)
        stats["invalid"] += 1
        stats["invalid_kinds"][how] = stats["invalid_kinds"].get(how, 0) + 1
    return stats


def describe(programs: Sequence[Program]) -> str:
    """Text of several programs (for failure messages)."""
    return "\n".join(str(p) for p in programs)
