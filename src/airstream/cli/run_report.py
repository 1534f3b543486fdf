"""What ``airstream run --torchair`` says when the script ends: which ops of its compiled graphs
ran on which stream, in plain words (bookkeeping nodes left out, max-autotune segments named)."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Sequence

from airstream.runtime.trace import CallTrace, OpRecord, remove_listener

__all__ = ["WhereRan", "where_ran"]


# FX nodes that only unpack or check values: left out of the report of what ran where
_BOOKKEEPING = ("getitem", "sym_size", "sym_numel", "sym_stride", "_assert")
_REPORT_CALLS = 20  # compiled calls traced for the report; later calls run untraced
_SEGMENT_NOTE = (
    "a kernel segment is a run of consecutive ops of one stream, between its waits and\n"
    "records, that max-autotune compiled with Inductor into one call of generated kernels"
)


class WhereRan:
    """A trace listener keeping the ops of each distinct compiled graph a script called,
    from its first ``limit`` compiled calls (then it stops listening, so later calls run
    untraced)."""

    def __init__(self, limit: int = _REPORT_CALLS) -> None:
        self.limit = limit
        self.calls = 0
        self.graphs: dict[tuple[tuple[str, str], ...], list[OpRecord]] = {}
        self._lock = threading.Lock()

    def __call__(self, trace: CallTrace) -> None:
        ops = sorted(trace.ops, key=lambda r: r.start_ns)
        key = tuple(sorted((r.stream or "", r.name) for r in ops))
        with self._lock:
            self.calls += 1
            self.graphs.setdefault(key, ops)
            if self.calls >= self.limit:
                remove_listener(self)


def _op_name(node: str) -> str | None:
    """The op an FX node name stands for (``abs_1`` -> ``abs``); None for bookkeeping."""
    base = re.sub(r"_\d+$", "", node)
    return None if base.startswith(_BOOKKEEPING) else base


def _op_list(ops: Sequence[str], most: int = 8) -> str:
    """``ops`` in first-seen order, repeats counted: ``t x2, addmm x2, silu``."""
    counts = Counter(ops)
    shown = [f"{op} x{counts[op]}" if counts[op] > 1 else op for op in counts]
    more = f", and {len(shown) - most} more kinds" if len(shown) > most else ""
    return ", ".join(shown[:most]) + more


def _plural(count: int, word: str) -> str:
    """``1 op``, ``2 ops``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def _stream_line(label: str, records: Sequence[OpRecord]) -> str | None:
    """One line saying which ops ran on stream ``label`` and how; None if only bookkeeping."""
    ops: list[str] = []
    fused = segments = 0
    for record in records:
        names = [op for op in map(_op_name, record.fused or (record.name,)) if op]
        ops += names
        if record.fused:
            fused, segments = fused + len(names), segments + 1
    if not ops:
        return None
    into = f"fused by max-autotune into {_plural(segments, 'kernel segment')}"
    alone = len(ops) - fused
    if not segments:
        how = f"{_plural(alone, 'op')}, run one by one"
    elif not alone:
        how = f"{_plural(fused, 'op')}, {into}"
    else:
        how = f"{_plural(len(ops), 'op')}: {fused} {into}, {alone} run one by one"
    return f"stream {label}: {_op_list(ops)} ({how})"


def _graph_lines(records: Sequence[OpRecord]) -> list[str]:
    """A line per stream of one compiled graph, main first."""
    streams: dict[str, list[OpRecord]] = {"main": []}
    for record in records:
        streams.setdefault(record.stream or "main", []).append(record)
    lines = (_stream_line(label, recs) for label, recs in streams.items())
    return [line for line in lines if line]


def where_ran(seen: WhereRan, most_graphs: int = 5) -> str:
    """In plain words, which ops of the compiled graphs ran on which stream."""
    if not seen.graphs:
        return "airstream: the script made no compiled calls through airstream's backend\n"
    graphs = list(seen.graphs.values())
    calls = (
        f"the first {seen.calls} calls" if seen.calls >= seen.limit else _plural(seen.calls, "call")
    )
    lines = [f"airstream: what ran where ({_plural(len(graphs), 'compiled graph')}, {calls}):"]
    for number, records in enumerate(graphs[:most_graphs], 1):
        indent = "  " if len(graphs) == 1 else "    "
        if len(graphs) > 1:
            lines.append(f"  graph {number} of {len(graphs)}:")
        lines += [indent + line for line in _graph_lines(records)]
    if len(graphs) > most_graphs:
        lines.append(f"  ... and {len(graphs) - most_graphs} more graphs")
    if any(r.fused for records in graphs for r in records):
        lines += ["  " + line for line in _SEGMENT_NOTE.splitlines()]
    return "\n".join(lines) + "\n"
