"""max-autotune: each segment (``schedule/segments.py``) compiled by Inductor, fused into one node.

For every segment: the views with gaps or broadcasts that are read after it are made after it
(``segment_cut.views_after``), then its nodes are cut out into a marker-free GraphModule
(``segment_cut.segment_module``; inputs: the values it reads from outside, in order of first
use, and any size symbol its code uses that they do not give Inductor; outputs: a tuple of the
values read after it), decomposed with Inductor's own decomposition table, given back each
output's recorded layout where a decomposition changed it
(``segment_layouts.restore_layouts``), and compiled with ``compile_fx_inner`` in a tracing
context of the graph's fake mode (C++ kernels on CPU, Triton on CUDA); the strides Inductor
reports for its outputs are then checked against the recorded ones, which the readers were
compiled for (``segment_layouts.check_layouts``).
Inductor's FX graph cache makes a later process reuse the artifacts; within a graph, segments
with the same code on the same input shapes share one compile (the experts of an MoE layer
compile once).

The graph is then rewritten: a call of the compiled segment replaces the segment's nodes at the
place of its first node, and ``getitem`` nodes unpack its outputs. The fused node carries
``meta["air_segment"]`` (a CompiledSegment: the nodes it fused, the kernels Inductor generated,
the compile time; read it with :func:`segment_of`) for dumps, the profiler and ``explain``, and
``meta["air_effects"]``, the summary of its members' effects, so the planner can plan the fused
graph from scratch (``airstream.graph.effects``).

A segment Inductor cannot compile runs as the aten code it was, with one warning naming the
segment, its nodes and Inductor's error (``CompiledGraph.fallbacks`` counts them);
``debug.strict_max_autotune`` makes that a PassError.
A segment that may run beside another stream's work gets kernels for
``stream_config.threads_per_stream`` threads, the intra-op threads each stream runs with there;
a segment that runs alone (``schedule/overlap.py``), kernels for every thread torch uses. On the
main stream, a matrix multiply beside another stream stays an aten call of its own, so the
runtime can give it every thread whenever the other streams are waiting.
"""

from __future__ import annotations

import logging
import operator
import re
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from airstream import torch_internals
from airstream.errors import PassError, TorchSupportError
from airstream.graph.effect_queries import summarize
from airstream.graph.effects import EFFECTS_KEY
from airstream.graph.fused import CompiledSegment, Segment
from airstream.graph.fusion import is_matmul
from airstream.graph.nodes import SEGMENT_KEY
from airstream.machine import environment
from airstream.schedule.overlap import overlapping_runs
from airstream.schedule.plan import StreamPlan
from airstream.schedule.segment_cut import SegmentOutput, segment_module, views_after
from airstream.schedule.segment_layouts import check_layouts, restore_layouts, wanted_strides
from airstream.schedule.segments import find_segments

__all__ = [
    "CompiledSegment",
    "SegmentOutput",
    "compile_segments",
    "fuse_streams",
    "kernel_names",
    "segment_module",
]

log = logging.getLogger("airstream")

STAGE = "max-autotune"


_KERNEL = re.compile(
    r"\b(cpp_fused_\w+|triton_\w+)\b|extern_kernels\.(\w+)|torch\.ops\.(aten\.\w+)"
)


def kernel_names(source: str) -> tuple[str, ...]:
    """Kernels named in Inductor's generated ``source``, in order of first appearance."""
    names: dict[str, None] = {}
    for match in _KERNEL.finditer(source):
        kernel, extern, fallback = match.groups()
        if kernel is not None:
            names.setdefault(kernel, None)
        elif extern is not None:
            names.setdefault(f"extern:{extern}", None)
        elif fallback is not None:
            names.setdefault(f"fallback:{fallback}", None)
    return tuple(names)


def _decompose(sub: torch.fx.GraphModule, fakes: Sequence[Any], fake_mode: Any) -> Any:
    """Retrace with Inductor's decompositions (Inductor lowers only what they leave)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_mode:
        traced = make_fx(
            torch.fx.Interpreter(sub).run,
            decomposition_table=torch_internals.inductor_decomposition_table(),
            tracing_mode="real",
        )(*fakes)
    torch_internals.tag_original_aten(traced)  # descriptive kernel names (cpp_fused_add_relu_0)
    return traced


def _compile(
    sub: torch.fx.GraphModule,
    fakes: Sequence[Any],
    fake_mode: Any,
    graph_kind: str,
    threads: int,
    outputs: Sequence[SegmentOutput],
    members: Sequence[torch.fx.Node] = (),
    release_gil: bool = True,
) -> tuple[Callable[[list[Any]], Any], tuple[str, ...], str]:
    """Inductor-compile one segment: (callable on a list of inputs, kernel names, cache). Its
    outputs come back in the strides recorded for them (what their readers were compiled for),
    or it raises segment_layouts.LayoutMismatch. ``release_gil``: its CPU kernels let go of
    the GIL."""
    decomposed = _decompose(sub, fakes, fake_mode)
    wanted = wanted_strides(sub)
    restore_layouts(decomposed, wanted, fake_mode)
    (output,) = decomposed.graph.find_nodes(op="output")
    torch_internals.pin_output_strides(output, wanted)  # torch 2.15 honors it for every layout
    hits = torch_internals.fxgraph_cache_hits()
    compiled = torch_internals.inductor_compile(
        decomposed,
        fakes,
        fake_mode=fake_mode,
        graph_kind=graph_kind,
        threads=threads,
        release_gil=release_gil,
    )
    after = torch_internals.fxgraph_cache_hits()
    check_layouts(sub, wanted, compiled.output_strides, outputs, members)
    cache = "unknown" if hits is None or after is None else "hit" if after > hits else "miss"
    return compiled.call, kernel_names(compiled.source), cache


def _key(sub: torch.fx.GraphModule, fakes: Sequence[Any]) -> tuple[Any, ...]:
    """Same ops on the same input shapes and layouts (node names aside): one compile serves
    both."""
    index = {node: i for i, node in enumerate(sub.graph.nodes)}

    def ref(node: torch.fx.Node) -> str:
        return f"%{index[node]}"

    ops = tuple(
        (
            node.op,
            str(node.target),
            str(torch.fx.map_arg(node.args, ref)),
            str(torch.fx.map_arg(node.kwargs, ref)),
        )
        for node in sub.graph.nodes
    )
    sig: list[tuple[Any, ...]] = []
    for val in fakes:
        if isinstance(val, torch.Tensor):
            sig.append((str(val.shape), str(val.stride()), val.dtype, str(val.device)))
        else:
            sig.append((type(val).__name__, str(val)))
    return (ops, tuple(sig))


def _runner(compiled: Callable[[list[Any]], Any], name: str) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return compiled(list(args))

    run.__name__ = run.__qualname__ = name
    return run


def _rewrite(
    gm: torch.fx.GraphModule,
    segment: Segment,
    inputs: list[torch.fx.Node],
    outputs: list[SegmentOutput],
    run: Callable[..., Any],
) -> tuple[torch.fx.Node, list[str]]:
    """Replace the segment's nodes by one call of ``run`` plus a getitem per tensor output;
    outer getitems of a member's tuple index the call's result instead."""
    graph = gm.graph
    members = list(segment.members)
    inside = set(members)
    # At the first member's place: every input is defined before it (a same-stream producer
    # between members would be a member, one from another stream would need a wait, which ends
    # a segment), and markers or waits that sit between members and read one still come after.
    first, last = members[0], members[-1]
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in inputs:  # a constant defined between members moves up with the fused node
        if node.op == "get_attr" and order[node] > order[first]:
            first.prepend(node)
    with graph.inserting_before(first):
        fused = graph.create_node("call_function", run, tuple(inputs), {}, name=segment.name)
    fused.meta = {k: v for k, v in last.meta.items() if k != "val"}
    fused.meta[EFFECTS_KEY] = summarize(members, [out.node for out in outputs])
    fused.meta["val"] = tuple(
        out.node.meta.get("val") if out.index is None else out.node.meta["val"][out.index]
        for out in outputs
    )
    getitems = []
    anchor = fused
    for position, out in enumerate(outputs):
        if out.index is not None:  # the outer getitems now index the fused result
            for user in [u for u in out.node.users if u not in inside]:
                if user.args[1] == out.index:
                    user.args = (fused, position)
            continue
        with graph.inserting_after(anchor):
            item = graph.call_function(operator.getitem, (fused, position))
        item.meta = dict(out.node.meta)
        out.node.replace_all_uses_with(item, delete_user_cb=lambda user: user not in inside)
        getitems.append(item.name)
        anchor = item
    for node in reversed(members):
        graph.erase_node(node)
    return fused, getitems


def _failed(segment: Segment, graph_kind: str, exc: Exception, strict: bool) -> CompiledSegment:
    """What became of a segment Inductor could not compile: aten code, with a warning; with
    ``strict``, a PassError instead."""
    error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    where = (
        f"max-autotune segment {segment.name} of the {graph_kind} graph "
        f"(stream {segment.stream or 'main'}; nodes {', '.join(segment.nodes)})"
    )
    if strict:
        raise PassError(
            f"Inductor could not compile {where}: {error}. Set "
            "debug.strict_max_autotune=False to run such segments as aten code.",
            pass_name=segment.name,
            stage=STAGE,
            graph_kind=graph_kind,
        ) from exc
    message = f"airstream: {where} runs as aten code; Inductor failed: {error}"
    log.warning("%s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    return CompiledSegment(segment, None, (), 0.0, "fallback", error)


_Shared = dict[tuple[Any, ...], tuple[Callable[[list[Any]], Any], tuple[str, ...]]]


def _compile_one(
    gm: torch.fx.GraphModule,
    segment: Segment,
    graph_kind: str,
    count: int,
    shared: _Shared,
    release_gil: bool,
) -> tuple[Callable[[list[Any]], Any], tuple[str, ...], str, float, Any, Any]:
    """Compile ``segment`` of ``gm`` (or reuse an identical segment's compiled code from
    ``shared``): the compiled code, its kernels, where it came from, the seconds it took, the
    segment's inputs and outputs. Raises whatever the compile raised."""
    start = time.perf_counter()
    views_after(gm, segment)
    sub, inputs, outputs = segment_module(gm, segment)
    fakes = [n.meta.get("val") for n in inputs]
    key = (_key(sub, fakes), count)
    if key in shared:
        compiled, kernels = shared[key]
        return compiled, kernels, "shared", 0.0, inputs, outputs
    # a segment with no tensor input (constants made before a wait) has its mode on its nodes'
    # values: a candidate compiled at its first call or a load has no tracing context to ask
    made = [n.meta.get("val") for n in segment.members]
    fake_mode = torch_internals.detect_fake_mode([*fakes, *made])
    if fake_mode is None:
        raise RuntimeError("no fake tensor metadata on the segment's inputs or values")
    compiled, kernels, cache = _compile(
        sub, fakes, fake_mode, graph_kind, count, outputs, segment.members, release_gil
    )
    shared[key] = (compiled, kernels)
    return compiled, kernels, cache, time.perf_counter() - start, inputs, outputs


def compile_segments(
    gm: torch.fx.GraphModule,
    segments: Sequence[Segment],
    *,
    graph_kind: str,
    threads: Callable[[Segment], int] = lambda segment: 0,
    strict: bool = False,
) -> list[CompiledSegment]:
    """Compile every segment and rewrite ``gm`` in place; return what became of each.

    ``threads(segment)`` > 0 fixes the intra-op threads of that segment's CPU kernels (0: as
    many as torch uses when the kernel runs).
    """
    torch_internals.require("max-autotune")  # a torch without them is an error, not a fallback
    # Read once per graph, here: a bad value is the user's error, not a segment's fallback.
    release_gil = environment.AIRSTREAM_KERNEL_GIL.read() == "release"
    results: list[CompiledSegment] = []
    shared: _Shared = {}
    for segment in segments:
        count = threads(segment)
        try:
            compiled, kernels, cache, seconds, inputs, outputs = _compile_one(
                gm, segment, graph_kind, count, shared, release_gil
            )
        except TorchSupportError:
            raise
        except Exception as exc:
            results.append(_failed(segment, graph_kind, exc, strict))
            continue
        fused, _ = _rewrite(gm, segment, inputs, outputs, _runner(compiled, segment.name))
        result = CompiledSegment(segment, fused.name, kernels, seconds, cache, threads=count)
        fused.meta[SEGMENT_KEY] = result
        results.append(result)
    gm.graph.lint()
    return results


def fuse_streams(
    gm: torch.fx.GraphModule,
    plan: StreamPlan,
    *,
    graph_kind: str,
    min_ops: int = 2,
    threads_per_stream: int = 1,
    strict: bool = False,
) -> tuple[CompiledSegment, ...]:
    """max-autotune on a planned graph: find each stream's segments in ``plan``, compile them and
    rewrite ``gm`` in place; return what became of each segment. The caller plans the rewritten
    graph again (each fused node carries its members' effects). A segment that may run beside
    another stream's work gets CPU kernels for ``threads_per_stream`` threads; one that runs
    alone (``schedule/overlap.py``), for every thread torch uses, as the runtime runs it."""
    overlapping = overlapping_runs(plan)
    # The main stream's matrix multiplies beside another stream stay aten calls (BLAS either
    # way): the runtime gives each every thread when no other stream works at that moment,
    # which a segment's kernels, generated for one count, could not take.
    main = plan.stream(None).runs
    found = find_segments(
        plan, min_ops, frozenset(n for n in main if n in overlapping and is_matmul(n))
    )

    def threads(segment: Segment) -> int:
        return threads_per_stream if any(n in overlapping for n in segment.members) else 0

    return tuple(compile_segments(gm, found, graph_kind=graph_kind, threads=threads, strict=strict))
