"""What measuring a placed graph compares (``stream_config.measure_placement``): the graph on one
stream, auto_streams' alternatives, the placement with other thread counts per stream
(``measure_threads``), or for microbatch_overlap's split the graph unsplit, each a copy of the
graph made before it is fused. Where an earlier process kept a decision for a static graph
(:mod:`airstream.compiler.decisions`), only the candidate it kept is made.
:mod:`airstream.compiler.measuring` wires the executors that run them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.fx

from airstream.compiler.decisions import DecisionStore, decision_store
from airstream.graph.devices import graph_device
from airstream.graph.mode import resolve_mode
from airstream.graph.nodes import AUTO_STREAMS_KEY, CANDIDATES_KEY, NAMES_KEY, graph_kind
from airstream.graph.placements import as_placed, on_one_stream, on_streams
from airstream.graph.streams import STREAM_KEY, lower_streams, uses_streams
from airstream.options.config import CompilerConfig
from airstream.passes.auto.candidates import LIST_SCHEDULE, in_original_order, measured_here
from airstream.passes.auto.microbatch import UNSPLIT_KEY, MicrobatchSplit
from airstream.passes.manager import BUILTIN, FINAL, PassManager
from airstream.runtime.measured import ALL_SIZES, ONE_STREAM, PLACED, Measurement
from airstream.runtime.size_ranges import SizeRanges, size_ranges

__all__ = [
    "SPLIT_ONE_STREAM",
    "Candidate",
    "Candidates",
    "candidates_for",
    "prepared_unsplit",
    "threads_candidate",
]

SPLIT_ONE_STREAM = "micro-batches on one stream"


@dataclass(frozen=True)
class Candidate:
    """A graph measured beside the placement: another placement, one stream, or the placement
    itself with ``threads`` intra-op threads per stream (None: ``threads_per_stream``'s)."""

    graph: torch.fx.GraphModule
    threads: int | None = None


@dataclass(frozen=True)
class Candidates:
    """What measuring a placed graph compares: the graph on one stream (None where a stored
    decision kept another candidate), the other candidates by name (auto_streams'
    alternatives, the placement with other thread counts), its size ranges (None: static),
    where its decisions are kept (None: nowhere), those kept before (by range), and a static
    graph's decision kept before (``settled``: then only the candidate it kept is made)."""

    one_stream: torch.fx.GraphModule | None
    alternatives: dict[str, Candidate]
    sizes: SizeRanges | None
    store: DecisionStore | None
    known: dict[str, Measurement]
    settled: Measurement | None
    crossings: dict[str, int]  # each placement's values handed between streams
    split: MicrobatchSplit | None = None  # microbatch_overlap's: one stream is the unsplit graph


def candidates_for(
    gm: torch.fx.GraphModule, config: CompilerConfig, kind: str
) -> Candidates | None:
    """The candidates ``gm`` (placed, its streams settled) is measured against, or None where
    ``measure_placement`` does not measure it."""
    if not _measures(gm, config):
        return None
    bounds = config.stream_config.measure_ranges
    sizes = size_ranges(gm, None if bounds == "pow2" else bounds)
    split = gm.meta.get(UNSPLIT_KEY)
    if isinstance(split, MicrobatchSplit):
        return _split_candidates(gm, split, sizes, config)
    mode = resolve_mode(config, graph_device(gm).type)
    store = decision_store(gm, config, kind, mode, STREAM_KEY)
    known = store.load() if store is not None else {}
    names = {f"auto_streams {name}": name for name in gm.meta.get(NAMES_KEY, ())}
    threads = {threads_candidate(t): t for t in _thread_counts(gm, config)}
    settled = known.get(ALL_SIZES) if sizes is None else None
    if settled is not None and settled.chosen not in (PLACED, ONE_STREAM, *threads, *names):
        settled = None  # kept for candidates this compile does not have: measured again
    kept = None if settled is None else settled.chosen  # decided before: only it is made
    alternatives = {n: Candidate(as_placed(gm), t) for n, t in threads.items() if kept in (None, n)}
    for candidate, name in names.items():
        if kept in (None, candidate):
            graph = on_streams(gm, functools.partial(_label_in, name))
            if name != LIST_SCHEDULE:
                in_original_order(graph)
            alternatives[candidate] = Candidate(graph)
    crossings = {PLACED: _crossings(gm)}
    crossings.update({k: _crossings(c.graph) for k, c in alternatives.items()})
    # a decision kept before for another candidate: no one-stream copy to make
    one_stream = None if kept not in (None, ONE_STREAM) else on_one_stream(gm)
    if one_stream is not None:  # as the graph was before the list schedule reordered it
        in_original_order(one_stream)
    return Candidates(one_stream, alternatives, sizes, store, known, settled, crossings)


def _split_candidates(
    gm: torch.fx.GraphModule,
    split: MicrobatchSplit,
    sizes: SizeRanges | None,
    config: CompilerConfig,
) -> Candidates:
    """microbatch_overlap's split measured against the graph unsplit (the baseline, on one
    stream) and the split on one stream, every rank deciding alike: no decision is stored or
    read (ranks reading a decision one of them stored while another measures would wait on
    each other's vote forever)."""
    unsplit = prepared_unsplit(split, config)
    alternatives = {}
    if uses_streams(gm):
        alternatives[SPLIT_ONE_STREAM] = Candidate(on_one_stream(gm))
    crossings = {PLACED: _crossings(gm), SPLIT_ONE_STREAM: 0}
    return Candidates(unsplit, alternatives, sizes, None, {}, None, crossings, split)


def prepared_unsplit(split: MicrobatchSplit, config: CompilerConfig) -> torch.fx.GraphModule:
    """The graph as microbatch_overlap found it, with the built-in passes after it run on it
    (once: the measured candidate and the few-token calls share it)."""
    unsplit = split.unsplit
    if not unsplit.meta.get(_PREPARED_KEY):
        PassManager(config).run(
            unsplit,
            split.example_inputs,
            graph_kind(unsplit),
            settle=functools.partial(lower_streams, single_stream=True),
            stages=(BUILTIN, FINAL),
        )
        unsplit.meta[_PREPARED_KEY] = True
    return unsplit


_PREPARED_KEY = "air_microbatch_prepared"


def _crossings(gm: torch.fx.GraphModule) -> int:
    """How many (value, reader) pairs of a placement are on different streams: the syncs it
    asks for, before the planner drops those earlier waits imply."""
    return sum(
        1
        for node in gm.graph.nodes
        for user in node.users
        if STREAM_KEY in node.meta
        and STREAM_KEY in user.meta
        and node.meta[STREAM_KEY] != user.meta[STREAM_KEY]
    )


def threads_candidate(threads: int) -> str:
    """The name of the placement measured with ``threads`` intra-op threads per stream."""
    return f"{PLACED}, {threads} threads per stream"


def _thread_counts(gm: torch.fx.GraphModule, config: CompilerConfig) -> tuple[int, ...]:
    """The thread counts per stream the placement is measured with beside
    ``threads_per_stream`` (``stream_config.measure_threads``; ``"auto"``: the process's
    intra-op threads split evenly over the placement's streams)."""
    options = config.stream_config
    counts = options.measure_threads
    if counts == "auto":
        labels = {n.meta[STREAM_KEY] for n in gm.graph.nodes if STREAM_KEY in n.meta}
        streams = len(labels | {None})  # main's too
        counts = (max(1, torch.get_num_threads() // streams),)
    return tuple(t for t in counts if t != options.threads_per_stream)


def _label_in(candidate: str, node: torch.fx.Node) -> str | None:
    """A node's stream in an alternative placement (auto_streams' candidates.py)."""
    labels = node.meta.get(CANDIDATES_KEY)
    return labels.get(candidate) if isinstance(labels, dict) else None


def _measures(gm: torch.fx.GraphModule, config: CompilerConfig) -> bool:
    """Whether ``stream_config.measure_placement`` measures this graph: a CPU graph the passes
    (with ``"auto"``: auto_streams) put on several streams, run by streams (no debug executor)."""
    setting = config.stream_config.measure_placement
    decision = gm.meta.get(AUTO_STREAMS_KEY)
    auto_placed = decision is not None and bool(getattr(decision, "applied", False))
    split = isinstance(gm.meta.get(UNSPLIT_KEY), MicrobatchSplit)  # measured though on one stream
    return (
        (setting is True or (setting == "auto" and (auto_placed or split)))
        and measured_here(gm, config)
        and (uses_streams(gm) or split)
    )
