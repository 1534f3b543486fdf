"""The executor a graph gets once its passes have run: the placement alone
(:func:`airstream.compiler.finish.finish_graph`), or, where ``stream_config.measure_placement``
measures it, the placement and its candidates (:mod:`airstream.compiler.candidate_graphs`)
timed against each other over its first calls
(:class:`airstream.runtime.measured.MeasuredExecutor`), each finished on its own: the placement
now, the others at their first call (:class:`airstream.runtime.deferred.DeferredExecutor`); the
decisions go to the graph's store (:mod:`airstream.compiler.decisions`).

A compile (:class:`airstream.compiler.pipeline.GraphCompiler`) and a graph loaded from a compile
cache (:mod:`airstream.compiler.cached_graph`) both start here, so a loaded graph is measured,
and reads the decisions kept on disk, as a compiled one is.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.fx

from airstream.compiler.candidate_graphs import (
    Candidate,
    Candidates,
    candidates_for,
    prepared_unsplit,
)
from airstream.compiler.finish import finish_graph
from airstream.debug.observers import CompileObserver
from airstream.graph.nodes import MEASUREMENT_KEY
from airstream.options.config import CompilerConfig
from airstream.passes.auto.microbatch import UNSPLIT_KEY, MicrobatchSplit
from airstream.passes.auto.rank_agreement import max_over_ranks
from airstream.passes.manager import PassResult
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
from airstream.runtime.token_switch import TokenCountSwitch

__all__ = ["finish_placed"]


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
    measured against its candidates where ``measure_placement`` says so, else as placed.
    ``static_inputs``: the inputs that are parameters or buffers, where AOTAutograd does not
    say (a load); ``loaded``: the graph came from a compile cache (its passes ran in the
    process that saved it)."""
    finish = functools.partial(
        finish_graph, config=config, kind=kind, results=results, static_inputs=static_inputs
    )
    # the graph the backend reports (a candidate made later reports nowhere)
    reported = functools.partial(
        finish, observer=observer, capture_pool=capture_pool, loaded=loaded
    )
    candidates = candidates_for(gm, config, kind)
    if candidates is None:
        executor = reported(gm)
    elif candidates.settled is not None:
        executor = _finish_settled(gm, candidates, candidates.settled, reported, config)
    else:
        executor = _finish_measured(gm, candidates, finish, reported(gm), config)
    split = gm.meta.get(UNSPLIT_KEY)
    if isinstance(split, MicrobatchSplit) and split.token_input is not None:
        # a dynamic split graph: calls with too few tokens run it unsplit
        unsplit = _deferred(finish, Candidate(prepared_unsplit(split, config)), config)
        return TokenCountSwitch(executor, unsplit, split.token_input, split.min_tokens)
    return executor


def _finish_settled(
    gm: torch.fx.GraphModule,
    candidates: Candidates,
    settled: Measurement,
    reported: Callable[..., Executor],
    config: CompilerConfig,
) -> Executor:
    """A static graph an earlier process decided: only the candidate it kept compiles."""
    kept = candidates.alternatives.get(str(settled.chosen))
    kept = kept or Candidate(candidates.one_stream or gm)
    kept.graph.meta[MEASUREMENT_KEY] = Measurements("", {ALL_SIZES: settled}, ALL_SIZES)
    return reported(kept.graph, config=_with_threads(config, kept.threads))


def _finish_measured(
    gm: torch.fx.GraphModule,
    candidates: Candidates,
    finish: Callable[..., Executor],
    placed: Executor,
    config: CompilerConfig,
) -> MeasuredExecutor:
    """The placement (``placed``, compiled now) and its candidates, compiled at their first
    call (each on a call measuring does not time, so the graph's first call waits for the
    placement's compile alone), handed to a :class:`MeasuredExecutor`."""
    executors: dict[str, Executor] = {PLACED: placed}
    for name, candidate in candidates.alternatives.items():  # other placements, thread counts
        executors[name] = _deferred(finish, candidate, config)
    # simplest first: a placement must beat a simpler one (measured.decide)
    executors = dict(sorted(executors.items(), key=lambda c: candidates.crossings[c[0]]))
    assert candidates.one_stream is not None  # made wherever nothing was settled
    executors[ONE_STREAM] = _deferred(finish, Candidate(candidates.one_stream), config)
    options, sizes, store = config.stream_config, candidates.sizes, candidates.store
    measured = MeasuredExecutor(
        executors,
        options.measure_calls,
        options.measure_min_gain,
        sizes=sizes,
        described_sizes="" if sizes is None else sizes.describe(),
        known=candidates.known,
        on_decided=store.save if store is not None else None,
        agree=(
            functools.partial(_slowest_rank, groups=candidates.split.groups)
            if candidates.split is not None
            else None
        ),
    )
    gm.meta[MEASUREMENT_KEY] = measured.measurements
    return measured


def _deferred(
    finish: Callable[..., Executor], candidate: Candidate, config: CompilerConfig
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
