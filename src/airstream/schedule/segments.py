"""Segments for max-autotune: runs of fusible ops between a stream's sync points.

A segment is a maximal run of consecutive ``Run`` steps of one stream's program, with no
``Record`` or ``Wait`` step inside it, made only of ops :func:`airstream.graph.fusion.fusible`
accepts. Every value another stream reads is followed by a record, and every value read from another
stream is preceded by a wait, so a segment's inputs are complete when it starts and nothing outside
it needs a value before it ends: fusing it into one step never crosses a stream or a sync.
``schedule/fuse.py`` compiles and substitutes them; the planner then plans the final graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx

from airstream.graph.fused import Segment
from airstream.graph.fusion import fusible
from airstream.schedule.plan import Run, StreamPlan, StreamSteps

__all__ = ["Segment", "find_segments"]

Label = str | None


def _label_name(label: Label) -> str:
    text = "main" if label is None else label
    return "".join(c if c.isalnum() else "_" for c in text)


def _runs(program: StreamSteps, apart: frozenset[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """The maximal fusible runs of one stream's program (a node of ``apart`` ends one and
    stays a step of its own)."""
    runs: list[list[torch.fx.Node]] = []
    current: list[torch.fx.Node] = []
    inside: set[torch.fx.Node] = set()
    for step in program.steps:
        node = step.node if isinstance(step, Run) else None
        if node is not None and node not in apart and fusible(node, inside):
            current.append(node)
            inside.add(node)
            continue
        if current:  # a record, a wait or an unfusible op ends the run
            runs.append(current)
        current, inside = [], set()
    if current:
        runs.append(current)
    return runs


# aten's CPU kernels cover few ops for these dtypes (``add`` on uint16 raises
# NotImplementedError); Inductor generates code for them, so a run using one is compiled
# however short it is.
_COMPILED_ONLY_DTYPES = frozenset({torch.uint16, torch.uint32, torch.uint64})


def _needs_codegen(run: Sequence[torch.fx.Node]) -> bool:
    for node in run:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype in _COMPILED_ONLY_DTYPES:
            return True
    return False


def find_segments(
    plan: StreamPlan, min_ops: int = 2, apart: frozenset[torch.fx.Node] = frozenset()
) -> list[Segment]:
    """The segments of every stream of ``plan`` with at least ``min_ops`` operators; the nodes
    of ``apart`` stay aten steps of their own.

    Shorter runs stay single aten steps: compiling one op buys no fusion (except for the wide
    unsigned dtypes, which only Inductor's code computes on CPU).
    """
    segments: list[Segment] = []
    for program in plan.streams:
        index = 0
        for run in _runs(program, apart):
            name = f"segment_{_label_name(program.label)}_{index}"
            segment = Segment(name, program.label, tuple(n.name for n in run), tuple(run))
            if segment.ops >= min_ops or _needs_codegen(run):
                segments.append(segment)
                index += 1
    return segments
