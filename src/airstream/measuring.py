"""The executor a graph gets once its passes have run: the placement alone
(:func:`airstream.finish.finish_graph`), or, where ``stream_config.measure_placement`` measures
it, the candidates timed against each other over its first calls
(:class:`airstream.runtime.measured.MeasuredExecutor`): the placement, auto_streams'
alternatives, the placement with other thread counts per stream (``measure_threads``) and the
graph on one stream, each finished on its own: the placement now, the
others at their first call (:class:`airstream.runtime.deferred.DeferredExecutor`).

A compile (:class:`airstream.pipeline.GraphCompiler`) and a graph loaded from a compile cache
(:mod:`airstream.cached_graph`) both start here, so a loaded graph is measured, and reads the
decisions kept on disk (:mod:`airstream.decisions`), as a compiled one is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch.fx

from airstream.config import CompilerConfig
from airstream.decisions import DecisionStore, decision_store
from airstream.devices import graph_device
from airstream.finish import finish_graph
from airstream.mode import resolve_mode
from airstream.nodes import (
    AUTO_STREAMS_KEY,
    CANDIDATES_KEY,
    MEASUREMENT_KEY,
    NAMES_KEY,
    graph_kind,
)
from airstream.observers import CompileObserver
from airstream.passes.auto.candidates import LIST_SCHEDULE, in_original_order, measured_here
from airstream.passes.auto.microbatch import UNSPLIT_KEY, MicrobatchSplit
from airstream.passes.auto.rank_agreement import max_over_ranks
from airstream.passes.manager import BUILTIN, FINAL, PassManager, PassResult
from airstream.placements import as_placed, on_one_stream, on_streams
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.codegen import Executor
from airstream.runtime.deferred import DeferredExecutor
from airstream.runtime.measured import (
    ALL_SIZES,
    ONE_STREAM,
    PLACED,
    MeasuredExecutor,
    Measurement,
    Measurements,
)
from airstream.runtime.size_ranges import SizeRanges, size_ranges
from airstream.runtime.token_switch import TokenCountSwitch
from airstream.streams import STREAM_KEY, lower_streams, uses_streams

__all__ = ["finish_placed", "threads_candidate"]


def finish_placed(
    gm: torch.fx.GraphModule,
    config: CompilerConfig,
    kind: str,
    observer: CompileObserver,
    results: tuple[PassResult, ...] = (),
    capture_pool: CapturePool | None = None,
    static_inputs: tuple[int, ...] | None = None,
    loaded: bool = False,
) -> Executor:
    """``gm`` (its passes run, its streams settled) finished into the executor that runs it:
    measured against one stream where ``measure_placement`` says so, else as placed.
    ``static_inputs``: the inputs that are parameters or buffers, where AOTAutograd does not
    say (a load); ``loaded``: the graph came from a compile cache (its passes ran in the
    process that saved it)."""
    finish = functools.partial(
        finish_graph, config=config, kind=kind, results=results, static_inputs=static_inputs
    )
    executor = _finish_measured(gm, config, kind, finish, observer, capture_pool, loaded)
    split = gm.meta.get(UNSPLIT_KEY)
    if isinstance(split, MicrobatchSplit) and split.token_input is not None:
        # a dynamic split graph: calls with too few tokens run it unsplit
        unsplit = _deferred(finish, _Candidate(_prepared_unsplit(split, config)), config)
        return TokenCountSwitch(executor, unsplit, split.token_input, split.min_tokens)
    return executor


def _finish_measured(
    gm: torch.fx.GraphModule,
    config: CompilerConfig,
    kind: str,
    finish: Callable[..., Executor],
    observer: CompileObserver,
    capture_pool: CapturePool | None,
    loaded: bool,
) -> Executor:
    """The placement's executor, measured against its alternatives where ``measure_placement``
    says so."""
    measuring = _measuring(gm, config, kind) if _measures(gm, config) else None
    if measuring is not None and measuring.settled is not None:
        # a static graph an earlier process decided: only the candidate it kept compiles
        settled = measuring.settled
        kept = measuring.alternatives.get(str(settled.chosen))
        kept = kept or _Candidate(measuring.one_stream or gm)
        kept.graph.meta[MEASUREMENT_KEY] = Measurements("", {ALL_SIZES: settled}, ALL_SIZES)
        return finish(
            kept.graph,
            config=_with_threads(config, kept.threads),
            observer=observer,
            capture_pool=capture_pool,
            loaded=loaded,
        )
    executor = finish(gm, observer=observer, capture_pool=capture_pool, loaded=loaded)
    if measuring is None:
        return executor
    # the other candidates compile at their first call (each on a call measuring does not
    # time), so the graph's first call waits for the placement's compile alone
    candidates: dict[str, Executor] = {PLACED: executor}
    for name, candidate in measuring.alternatives.items():  # other placements, thread counts
        candidates[name] = _deferred(finish, candidate, config)
    # simplest first: a placement must beat a simpler one (measured.decide)
    candidates = dict(sorted(candidates.items(), key=lambda c: measuring.crossings[c[0]]))
    assert measuring.one_stream is not None  # built wherever nothing was settled
    candidates[ONE_STREAM] = _deferred(finish, _Candidate(measuring.one_stream), config)
    options = config.stream_config
    sizes, store = measuring.sizes, measuring.store
    measured = MeasuredExecutor(
        candidates,
        options.measure_calls,
        options.measure_min_gain,
        sizes=sizes,
        described_sizes="" if sizes is None else sizes.describe(),
        known=measuring.known,
        on_decided=store.save if store is not None else None,
        agree=(
            functools.partial(_slowest_rank, groups=measuring.split.groups)
            if measuring.split is not None
            else None
        ),
    )
    gm.meta[MEASUREMENT_KEY] = measured.measurements
    return measured


def _deferred(
    finish: Callable[..., Executor], candidate: _Candidate, config: CompilerConfig
) -> DeferredExecutor:
    """``candidate`` finished at its first call (its compile events go nowhere: the graph the
    backend reports is the placement's)."""
    return DeferredExecutor(
        functools.partial(
            finish,
            candidate.graph,
            config=_with_threads(config, candidate.threads),
            observer=CompileObserver(),
        )
    )


def _with_threads(config: CompilerConfig, threads: int | None) -> CompilerConfig:
    """``config``, or a copy of it whose streams run with ``threads`` intra-op threads each."""
    if threads is None:
        return config
    out = config.copy()
    out.stream_config.threads_per_stream = threads
    return out


@dataclass(frozen=True)
class _Candidate:
    """A graph measured beside the placement: another placement, one stream, or the placement
    itself with ``threads`` intra-op threads per stream (None: ``threads_per_stream``'s)."""

    graph: torch.fx.GraphModule
    threads: int | None = None


@dataclass(frozen=True)
class _Measuring:
    """What measuring a placed graph needs, taken before it is fused: the graph on one stream
    (None where a stored decision kept another candidate), the other candidates by name
    (auto_streams' alternatives, the placement with other thread counts), its size ranges
    (None: static), where its decisions are kept (None: nowhere), those kept before (by
    range), and a static graph's decision kept before (``settled``: then only the candidate it
    kept is built)."""

    one_stream: torch.fx.GraphModule | None
    alternatives: dict[str, _Candidate]
    sizes: SizeRanges | None
    store: DecisionStore | None
    known: dict[str, Measurement]
    settled: Measurement | None
    crossings: dict[str, int]  # each placement's values handed between streams
    split: MicrobatchSplit | None = None  # microbatch_overlap's: one stream is the unsplit graph


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


def _measuring(gm: torch.fx.GraphModule, config: CompilerConfig, kind: str) -> _Measuring:
    bounds = config.stream_config.measure_ranges
    sizes = size_ranges(gm, None if bounds == "pow2" else bounds)
    mode = resolve_mode(config, graph_device(gm).type)
    store = decision_store(gm, config, kind, mode, STREAM_KEY)
    known = store.load() if store is not None else {}
    names = {f"auto_streams {name}": name for name in gm.meta.get(NAMES_KEY, ())}
    threads = {threads_candidate(t): t for t in _thread_counts(gm, config)}
    settled = known.get(ALL_SIZES) if sizes is None else None
    if settled is not None and settled.chosen not in (PLACED, ONE_STREAM, *threads, *names):
        settled = None  # kept for candidates this compile does not have: measured again
    kept = None if settled is None else settled.chosen  # decided before: only it is built
    alternatives = {
        n: _Candidate(as_placed(gm), t) for n, t in threads.items() if kept in (None, n)
    }
    for candidate, name in names.items():
        if kept in (None, candidate):
            graph = on_streams(gm, functools.partial(_label_in, name))
            if name != LIST_SCHEDULE:
                in_original_order(graph)
            alternatives[candidate] = _Candidate(graph)
    crossings = {PLACED: _crossings(gm)}
    crossings.update({k: _crossings(c.graph) for k, c in alternatives.items()})
    split = gm.meta.get(UNSPLIT_KEY)
    if isinstance(split, MicrobatchSplit):
        return _split_measuring(gm, split, sizes, config)
    # a decision kept before for another candidate: no one-stream copy to build
    one_stream = None if kept not in (None, ONE_STREAM) else on_one_stream(gm)
    if one_stream is not None:  # as the graph was before the list schedule reordered it
        in_original_order(one_stream)
    return _Measuring(one_stream, alternatives, sizes, store, known, settled, crossings)


SPLIT_ONE_STREAM = "micro-batches on one stream"


def _split_measuring(
    gm: torch.fx.GraphModule,
    split: MicrobatchSplit,
    sizes: SizeRanges | None,
    config: CompilerConfig,
) -> _Measuring:
    """microbatch_overlap's split measured against the graph unsplit (the baseline, on one
    stream) and the split on one stream, every rank deciding alike: no decision is stored or
    read (ranks reading a decision one of them stored while another measures would wait on
    each other's vote forever)."""
    unsplit = _prepared_unsplit(split, config)
    alternatives = {}
    if uses_streams(gm):
        alternatives[SPLIT_ONE_STREAM] = _Candidate(on_one_stream(gm))
    crossings = {PLACED: _crossings(gm), SPLIT_ONE_STREAM: 0}
    return _Measuring(unsplit, alternatives, sizes, None, {}, None, crossings, split)


def _prepared_unsplit(split: MicrobatchSplit, config: CompilerConfig) -> torch.fx.GraphModule:
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


def _slowest_rank(measurement: Measurement, groups: tuple[str, ...]) -> None:
    """Each candidate's times, call by call, the slowest rank's over the process groups the
    split graph's collectives run on (a step takes as long as its slowest rank), so that every
    rank decides alike: a split on one rank and not on another would pair different
    collectives. Every rank reaches this at the same call (measuring's turns follow the call
    count) where the ranks call the graph in lockstep with the same sizes."""
    names = sorted(measurement.seconds)
    calls = min(len(measurement.seconds[n]) for n in names)
    times = torch.tensor([measurement.seconds[n][:calls] for n in names], dtype=torch.float64)
    times = max_over_ranks(times, groups)
    for name, row in zip(names, times.tolist(), strict=True):
        measurement.seconds[name] = row


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
