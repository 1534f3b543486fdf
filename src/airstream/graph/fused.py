"""A max-autotune segment and what became of it: the types the fuser (``schedule/fuse.py``)
writes into a fused node's meta and that analysis, the runtime and reports read."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch.fx

__all__ = ["CompiledSegment", "Label", "Segment"]

Label = str | None


@dataclass(frozen=True)
class Segment:
    """One fusible run of a stream's program: ``name``, its ``stream``, the names of its nodes in
    program order (``nodes``, kept for reports after the nodes are fused away) and the nodes
    themselves (``members``)."""

    name: str
    stream: Label
    nodes: tuple[str, ...]
    members: tuple[torch.fx.Node, ...] = field(default=(), compare=False, repr=False)

    @property
    def ops(self) -> int:
        """Operators in the segment (tuple indexing not counted)."""
        if not self.members:
            return len(self.nodes)
        return sum(1 for node in self.members if node.target is not operator.getitem)


@dataclass(frozen=True)
class CompiledSegment:
    """What became of one segment.

    Attributes:
        segment: the segment (stream, node names).
        node: the fused node's name in the rewritten graph; None if the segment fell back.
        kernels: the kernels Inductor generated or called (``cpp_fused_*``, ``triton_*``,
            ``extern:mm``, ...), in order of appearance in its code.
        compile_s: seconds spent compiling it (0 for a segment sharing an earlier compile).
        cache: ``miss`` (compiled now), ``hit`` (Inductor's FX graph cache), ``shared`` (same code
            as an earlier segment of this graph), ``fallback``, or ``unknown`` (compiled; this
            torch does not say whether its cache hit).
        fallback: Inductor's error when the segment runs as aten code, else ``""``.
        threads: the intra-op threads its CPU kernels were generated for (0: as many as torch
            uses when they run; ``threads_per_stream`` where it may run beside another stream).
    """

    segment: Segment
    node: str | None
    kernels: tuple[str, ...]
    compile_s: float
    cache: str
    fallback: str = ""
    threads: int = 0

    def describe(self) -> str:
        """One line: the segment, what it fused, its kernels."""
        fused = ", ".join(self.segment.nodes)
        if self.node is None:
            return f"{self.segment.name} (aten fallback: {self.fallback}) [{fused}]"
        kernels = ", ".join(self.kernels) or "no kernels"
        threads = f" ({self.threads} thread{'s' * (self.threads > 1)})" if self.threads else ""
        return f"{self.segment.name}{threads}: {kernels} [fused {fused}]"
