"""Segments for max-autotune: runs of plain aten ops between a stream's sync points.

A segment is a maximal run of consecutive ``Run`` steps of one stream's program, with no
``Record`` or ``Wait`` step inside it, made only of ops a compiler may fuse: aten/prims operators
(and tuple indexing of them) that neither draw random numbers nor mutate anything but a graph
input (the trailing ``copy_`` of an input mutation). Every value another stream reads is followed
by a record, and every value read from another stream is preceded by a wait, so a segment's
inputs are complete when it starts and nothing outside it needs a value before it ends: fusing it
into one step never crosses a stream or a sync.

``substitute`` turns the plan of the original graph into the plan of the segmented one: each
segment's steps become one ``Run`` of the fused node followed by the ``getitem`` nodes that unpack
its outputs; every record and wait keeps its place, so the syncs stay exactly those the planner
proved sufficient.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.fx

from airstream.ops.library import is_air_op
from airstream.schedule.plan import Record, Run, Step, StreamPlan, StreamSteps, Sync, Wait
from airstream.schedule.streams import StreamAssignment
from airstream.torch_internals import OpOverload, op_schema

__all__ = ["Segment", "find_segments", "fusible", "substitute"]

Label = str | None

_FUSIBLE_NAMESPACES = frozenset({"aten", "prims"})


@dataclass(frozen=True)
class Segment:
    """One fusible run of a stream's program: ``name``, its ``stream``, and its node names in
    program order."""

    name: str
    stream: Label
    nodes: tuple[str, ...]

    @property
    def ops(self) -> int:
        """Operators in the segment (tuple indexing not counted)."""
        return len(self.nodes)


def _is_tensor_value(val: object) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    if isinstance(val, list | tuple):
        return len(val) > 0 and all(isinstance(v, torch.Tensor) for v in val)
    return False


def fusible(node: torch.fx.Node, inside: set[torch.fx.Node] | frozenset[torch.fx.Node]) -> bool:
    """May ``node`` join a segment whose nodes so far are ``inside``?

    aten/prims operators with tensor results; no random ops (they keep eager's generator order,
    DESIGN.md rule 6); no mutation except ``copy_`` into a graph input; ``getitem`` only of a node
    already in the segment.
    """
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        source = node.args[0]
        return isinstance(source, torch.fx.Node) and source in inside
    if is_air_op(target) or not isinstance(target, OpOverload):
        return False
    if target.namespace not in _FUSIBLE_NAMESPACES:
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    if not _is_tensor_value(node.meta.get("val")):
        return False
    if op_schema(target).is_mutable:
        dest = node.args[0] if node.args else None
        return (
            target is torch.ops.aten.copy_.default
            and isinstance(dest, torch.fx.Node)
            and dest.op == "placeholder"
        )
    return True


def _label_name(label: Label) -> str:
    text = "main" if label is None else label
    return "".join(c if c.isalnum() else "_" for c in text)


def _runs(program: StreamSteps, by_name: Mapping[str, torch.fx.Node]) -> list[list[str]]:
    """The maximal fusible runs of one stream's program (node names)."""
    runs: list[list[str]] = []
    current: list[torch.fx.Node] = []
    for step in program.steps:
        node = by_name[step.node] if isinstance(step, Run) else None
        if node is not None and fusible(node, frozenset(current)):
            current.append(node)
            continue
        if current:  # a record, a wait or an unfusible op ends the run
            runs.append([n.name for n in current])
        current = []
    if current:
        runs.append([n.name for n in current])
    return runs


def find_segments(gm: torch.fx.GraphModule, plan: StreamPlan, min_ops: int = 2) -> list[Segment]:
    """The segments of every stream of ``plan`` with at least ``min_ops`` operators.

    Shorter runs stay single aten steps: compiling one op buys no fusion.
    """
    by_name = {n.name: n for n in gm.graph.nodes}
    segments: list[Segment] = []
    for program in plan.streams:
        index = 0
        for run in _runs(program, by_name):
            ops = sum(1 for name in run if by_name[name].target is not operator.getitem)
            if ops >= min_ops:
                name = f"segment_{_label_name(program.label)}_{index}"
                segments.append(Segment(name, program.label, tuple(run)))
                index += 1
    return segments


def substitute(
    plan: StreamPlan,
    streams: StreamAssignment,
    replaced: Mapping[str, tuple[str, Sequence[str]]],
) -> tuple[StreamPlan, StreamAssignment]:
    """The plan and stream assignment after fusing segments.

    ``replaced`` maps every node name of a fused segment (in graph order) to ``(fused node, its
    getitem nodes)``. The fused node takes the place of the segment's last step (in each stream's
    program and in the global ``sequence``), its getitems right after it; the segment's other
    steps go. In the stream assignment it sits where the segment's first node was, as in the
    graph.
    """
    first_of: dict[str, str] = {}
    for name, (fused, _) in replaced.items():
        first_of.setdefault(fused, name)  # graph order: the fused node sits at the first member
    members: dict[str, list[str]] = {}
    for name, (fused, _) in replaced.items():
        members.setdefault(fused, []).append(name)

    def rewrite(steps: Sequence[tuple[Label, Step]]) -> list[tuple[Label, Step]]:
        seen: dict[str, int] = {}
        out: list[tuple[Label, Step]] = []
        for label, step in steps:
            if isinstance(step, Run) and step.node in replaced:
                fused, getitems = replaced[step.node]
                seen[fused] = seen.get(fused, 0) + 1
                if seen[fused] == len(members[fused]):  # the segment's last step
                    out.append((label, Run(fused)))
                    out += [(label, Run(g)) for g in getitems]
                continue
            out.append((label, step))
        return out

    new_streams = tuple(
        StreamSteps(s.label, tuple(step for _, step in rewrite([(s.label, x) for x in s.steps])))
        for s in plan.streams
    )
    sequence = tuple(rewrite(plan.sequence))

    def rename(name: str) -> str:
        return replaced[name][0] if name in replaced else name

    syncs = tuple(
        Sync(
            s.event,
            rename(s.producer),
            s.producer_stream,
            rename(s.consumer),
            s.consumer_stream,
            s.reason,
        )
        for s in plan.syncs
    )
    new_plan = StreamPlan(
        streams=new_streams,
        syncs=syncs,
        dropped_waits=plan.dropped_waits,
        priorities=plan.priorities,
        sequence=sequence,
    )
    stream_of: dict[str, Label] = {}
    for name, label in streams.stream_of.items():
        if name in replaced:
            fused, getitems = replaced[name]
            if name == first_of[fused]:
                stream_of[fused] = label
                stream_of.update(dict.fromkeys(getitems, label))
            continue
        stream_of[name] = label
    new_streams_assignment = StreamAssignment(
        stream_of=stream_of,
        streams=streams.streams,
        priorities=streams.priorities,
        scope_attrs=streams.scope_attrs,
    )
    _check(new_plan)
    return new_plan, new_streams_assignment


def _check(plan: StreamPlan) -> None:
    """Every wait still follows its record in the global order (a bug here would hang)."""
    recorded: set[int] = set()
    for _, step in plan.sequence:
        if isinstance(step, Record):
            recorded.add(step.event)
        elif isinstance(step, Wait) and step.event not in recorded:
            raise AssertionError(f"segment substitution put wait e{step.event} before its record")
