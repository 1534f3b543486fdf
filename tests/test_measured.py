"""``stream_config.measure_placement``: the streams the passes placed are kept only where a
graph's first calls measure them faster than the same graph on one stream
(``runtime/measured.py``). The decision rule is tested on a clock the test controls; compiled
graphs are tested for what runs, what is recorded and their results, never for which candidate
a real clock picked."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, cause_of, compile_model, graph_of

import airstream
from airstream import passes
from airstream.compiler.candidate_graphs import threads_candidate
from airstream.debug.observers import CompiledGraph, CompileObserver
from airstream.errors import ConfigError
from airstream.graph.streams import STREAM_KEY, uses_streams
from airstream.runtime.measured import (
    ONE_STREAM,
    PLACED,
    MeasuredExecutor,
    Measurement,
    decide,
)


class _Fake:
    """A candidate executor: records its calls, empties its argument list as executors do."""

    _boxed_call = True
    code = ""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def __call__(self, args: list[Any]) -> str:
        self.log.append(self.name)
        args.clear()
        return self.name


def _clock(durations: dict[str, Iterator[float]], log: list[str]) -> Any:
    """A clock on which each call of a candidate lasts its next duration."""
    now = [0.0]
    started = [False]

    def clock() -> float:
        if started[0]:  # the end of a call: advance by the duration of the one that ran
            now[0] += next(durations[log[-1]])
        started[0] = not started[0]
        return now[0]

    return clock


def _settled(timed: list[float]) -> Iterator[float]:
    """Each timed duration after an untimed call of 100 (what the other candidate left)."""
    return iter([d for t in timed for d in (100.0, t)])


def _run(one: list[float], placed: list[float], calls: int = 4, gain: float = 0.05) -> Any:
    log: list[str] = []
    durations = {ONE_STREAM: _settled(one), PLACED: _settled(placed)}
    measured = MeasuredExecutor(
        {PLACED: _Fake(PLACED, log), ONE_STREAM: _Fake(ONE_STREAM, log)},
        calls,
        gain,
        clock=_clock(durations, log),
    )
    results = [measured([1, 2]) for _ in range(4 * calls)]
    return measured, log, results


def test_the_placement_is_kept_where_it_wins_by_the_gain_in_most_pairs() -> None:
    # of each two calls the first is not counted (100 ms); one stream 10 ms, the placement 8 ms
    measured, log, results = _run([10, 10, 10, 10], [8, 8, 8, 8])
    assert log == [PLACED, PLACED, ONE_STREAM, ONE_STREAM] * 4  # two each, the placement first
    assert results == log  # every call returned its own candidate's result
    m = measured.measurement
    assert m.seconds == {ONE_STREAM: [10] * 4, PLACED: [8] * 4}
    assert m.chosen == PLACED and "1.25x of one stream, faster in 4 of 4 pairs" in m.reason
    assert measured([0]) == PLACED and list(measured.candidates) == [PLACED]


def test_one_stream_stays_where_the_placement_gains_less_than_min_gain() -> None:
    measured, _, _ = _run([10, 10, 10, 10], [9.8, 9.8, 9.8, 9.8])
    m = measured.measurement
    assert m.chosen == ONE_STREAM
    assert "1.02x of one stream" in m.reason and "needs 1.05x" in m.reason
    assert measured([0]) == ONE_STREAM and list(measured.candidates) == [ONE_STREAM]


def test_a_spike_on_one_side_does_not_decide() -> None:
    # the placement is slower in three pairs of four; one spike of one stream's (a busy moment)
    # raises its mean a lot and its median little: one stream stays
    measured, _, _ = _run([10, 10, 10, 200], [11, 11, 11, 1])
    assert measured.measurement.chosen == ONE_STREAM
    assert "faster in 1 of 4 pairs" in measured.measurement.reason


def test_the_rule_needs_both_the_gain_and_the_pairs() -> None:
    m = Measurement(4, 0.05, {ONE_STREAM: [10, 10, 30, 30], PLACED: [12, 12, 8, 8]})
    # medians 20 vs 10: 2x, but the placement won only 2 of 4 pairs
    assert decide(m)[0] == ONE_STREAM
    m = Measurement(3, 0.05, {ONE_STREAM: [10, 10, 10], PLACED: [9, 9, 11]})
    assert decide(m)[0] == PLACED  # 1.11x, 2 of 3 pairs


class TwoBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.left = torch.nn.Linear(16, 16)
        self.right = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.left(x)) + torch.sin(self.right(x))


def right_on_side(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    passes.place_on_stream(gm, passes.select_nodes(gm, module="right"), "side")


def _config(calls: int = 2) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = right_on_side
    config.stream_config.measure_placement = True
    config.stream_config.measure_calls = calls
    config.stream_config.measure_threads = ()  # the same candidates on a machine of any size
    return config


def _measures_and_decides(compiled: Any, model: torch.nn.Module, backend: Any) -> Measurement:
    with torch.no_grad():
        for step in range(4 * 2 + 2):  # 2 timed calls each (each after an untimed one), then
            x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    m = graph.measurement
    assert m is not None and m.chosen in (ONE_STREAM, PLACED)
    assert {k: len(v) for k, v in m.seconds.items()} == {ONE_STREAM: 2, PLACED: 2}
    assert m.describe().startswith(f"kept {m.chosen}: ")
    # the graph recorded is the placement's: the side stream is there to be measured
    assert any(n.meta.get(STREAM_KEY) == "side" for n in graph.graph_module.graph.nodes)
    assert len(backend.graphs) == 1  # the one-stream candidate is no graph of its own
    return m


def test_a_placed_graph_runs_both_candidates_in_turn_then_keeps_one() -> None:
    model = TwoBranches().eval()
    compiled, backend = compile_model(model, _config())
    _measures_and_decides(compiled, model, backend)


@pytest.mark.usefixtures("default_mode")
def test_in_the_default_mode_the_one_stream_candidate_has_segments_of_its_own() -> None:
    model = TwoBranches().eval()
    compiled, backend = compile_model(model, _config())
    _measures_and_decides(compiled, model, backend)
    graph = graph_of(backend, "inference")
    assert {s.segment.stream for s in graph.segments if s.node is not None} >= {None, "side"}


@pytest.mark.usefixtures("default_mode")
def test_a_training_steps_forward_and_backward_are_each_measured() -> None:
    model = TwoBranches()
    reference = copy.deepcopy(model)
    compiled, backend = compile_model(model, _config())
    for step in range(4 * 2 + 1):  # 2 timed calls of each candidate (each after an untimed one)
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step), requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, out_ref = compiled(x), reference(x_ref)
        out.sum().backward()
        out_ref.sum().backward()
        assert_same(out, out_ref, rtol=1e-5, atol=1e-5)
        assert_same(x.grad, x_ref.grad, rtol=1e-5, atol=1e-5)
        for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
            assert_same(mine.grad, theirs.grad, rtol=1e-4, atol=1e-4)
    assert sorted(g.kind for g in backend.graphs) == ["backward", "forward"]
    for graph in backend.graphs:  # each graph decides on its own calls
        m = graph.measurement
        assert m is not None and m.chosen in (ONE_STREAM, PLACED), graph.kind
        assert {k: len(v) for k, v in m.seconds.items()} == {ONE_STREAM: 2, PLACED: 2}
        assert uses_streams(graph.graph_module), graph.kind  # the placement's graph is reported


def test_a_graph_on_one_stream_is_not_measured() -> None:
    config = _config()
    config.post_grad_custom_pre_pass = None
    compiled, backend = compile_model(TwoBranches().eval(), config)
    with torch.no_grad():
        compiled(torch.randn(4, 16))
    assert graph_of(backend, "inference").measurement is None


def test_by_default_auto_streams_placements_are_measured_and_a_hand_pass_is_not() -> None:
    model = TwoBranches().eval()
    config = airstream.CompilerConfig()
    assert config.stream_config.measure_placement == "auto"
    config.post_grad_custom_pre_pass = passes.auto_streams(min_gain=0, costs="nominal")
    compiled, backend = compile_model(model, config)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 16)
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert graph.graph_module.meta["airstream_auto_streams"].applied
    assert graph.measurement is not None  # measuring: 3 calls are not enough to decide (32)
    assert graph.measurement.chosen is None and "measuring" in graph.measurement.describe()
    for setting, pass_ in ((False, config.post_grad_custom_pre_pass), ("auto", right_on_side)):
        other = airstream.CompilerConfig()
        other.post_grad_custom_pre_pass = pass_
        other.stream_config.measure_placement = setting
        compiled, backend = compile_model(model, other)
        with torch.no_grad():
            compiled(torch.randn(4, 16))
        assert graph_of(backend, "inference").measurement is None, setting


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("measure_min_gain", 2, "a number from 0 to 1"),
        ("measure_calls", 0, "an int >= 1"),
        ("measure_placement", "yes", "'auto', True, False"),
        ("measure_threads", (0, 2), "thread counts as distinct ints >= 1"),
        ("measure_threads", "all", "'auto', or thread counts"),
    ],
)
def test_a_bad_measure_option_is_named(option: str, value: Any, allowed: str) -> None:
    config = airstream.CompilerConfig()
    with pytest.raises(ConfigError) as raised:
        setattr(config.stream_config, option, value)
    error = cause_of(raised.value, ConfigError)
    assert error is not None
    assert f"stream_config.{option}" in str(error) and allowed in str(error)


class _Finished(CompileObserver):
    """Every graph a compile finishes (the placement, each candidate measured beside it)."""

    def __init__(self, inner: CompileObserver, seen: list[CompiledGraph]) -> None:
        self.inner, self.seen = inner, seen

    def graph_compiled(self, graph: CompiledGraph) -> None:
        self.seen.append(graph)
        self.inner.graph_compiled(graph)


@pytest.fixture
def finished(monkeypatch: pytest.MonkeyPatch) -> list[CompiledGraph]:
    """What each graph finished by the compile became: its executor, its segments."""
    import airstream.compiler.measuring as measuring

    seen: list[CompiledGraph] = []
    finish = measuring.finish_graph

    def keep(gm: torch.fx.GraphModule, *args: Any, observer: Any, **kwargs: Any) -> Any:
        return finish(gm, *args, observer=_Finished(observer, seen), **kwargs)

    monkeypatch.setattr(measuring, "finish_graph", keep)
    return seen


class SideFirst(torch.nn.Module):
    """Two branches, the one a pass puts on a side stream (``right``, whole) called first, so
    the main stream's branch runs beside it."""

    def __init__(self) -> None:
        super().__init__()
        # weights big enough that intra-op threads matter (schedule/overlap.py)
        self.left = torch.nn.Linear(256, 256)
        self.right = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.SiLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = self.right(x)
        return torch.relu(self.left(x)) * side


@pytest.mark.usefixtures("default_mode")
def test_the_placement_is_measured_with_other_thread_counts_per_stream(
    finished: list[CompiledGraph],
) -> None:
    model = SideFirst().eval()
    config = _config()
    config.stream_config.measure_threads = (2,)
    compiled, backend = compile_model(model, config)
    with torch.no_grad():
        for step in range(3 * 2 * 2 + 1):  # 3 candidates, 2 timed calls each, then one more
            x = torch.randn(8, 256, generator=torch.Generator().manual_seed(step))
            assert_same(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    m = graph_of(backend, "inference").measurement
    two = threads_candidate(2)
    assert m is not None and m.chosen in (ONE_STREAM, PLACED, two)
    assert {k: len(v) for k, v in m.seconds.items()} == {PLACED: 2, two: 2, ONE_STREAM: 2}
    # each candidate compiled on its own: the placement twice (1 and 2 threads), one stream once
    placed = [g for g in finished if uses_streams(g.graph_module)]
    by_threads = {g.executor.threads_per_stream: g for g in placed}
    assert set(by_threads) == {1, 2} and len(finished) == 3
    for threads, graph in by_threads.items():
        side = [s for s in graph.segments if s.node is not None and s.segment.stream == "side"]
        assert side and {s.threads for s in side} == {threads}, graph.segments


def test_auto_thread_counts_split_the_processs_threads_over_the_streams() -> None:
    model = TwoBranches().eval()
    config = _config()
    config.stream_config.measure_threads = "auto"
    before = torch.get_num_threads()
    for threads, extra in ((4, {threads_candidate(2)}), (2, set())):  # 2 streams
        torch.set_num_threads(threads)
        try:
            compiled, backend = compile_model(model, config)
            with torch.no_grad():
                compiled(torch.randn(4, 16))
        finally:
            torch.set_num_threads(before)
        m = graph_of(backend, "inference").measurement
        assert m is not None and set(m.seconds) == {PLACED, ONE_STREAM} | extra, threads
        torch.compiler.reset()


def test_calls_from_several_threads_each_count_once() -> None:
    import threading

    log: list[str] = []
    measured = MeasuredExecutor(
        {PLACED: _Fake(PLACED, log), ONE_STREAM: _Fake(ONE_STREAM, log)},
        3,
        0.0,
        clock=itertools.count().__next__,
    )
    threads = [
        threading.Thread(target=lambda: [measured([0]) for _ in range(10)]) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(log) == 40
    m = measured.measurement
    assert m.chosen is not None and {k: len(v) for k, v in m.seconds.items()} == {
        ONE_STREAM: 3,
        PLACED: 3,
    }


def _sized(durations: dict[str, list[float]], **kw: Any) -> tuple[MeasuredExecutor, list[str]]:
    """A measured executor over fakes whose calls last the given times (each after an untimed
    call of 100), the range of a call being its first argument."""
    log: list[str] = []
    fakes = {name: _Fake(name, log) for name in durations}
    clock = _clock({k: itertools.cycle([100.0, *v]) for k, v in durations.items()}, log)
    return MeasuredExecutor(fakes, 2, 0.05, sizes=lambda args: str(args[0]), clock=clock, **kw), log


def test_of_several_placements_the_fastest_that_passes_is_kept() -> None:
    log: list[str] = []
    names = ("roles", "list schedule", ONE_STREAM)
    durations = {"roles": [8.0], "list schedule": [6.0], ONE_STREAM: [10.0]}
    measured = MeasuredExecutor(
        {n: _Fake(n, log) for n in names},
        2,
        0.05,
        clock=_clock({k: itertools.cycle([100.0, *v]) for k, v in durations.items()}, log),
    )
    for _ in range(12):
        measured([0])
    assert log == ["roles", "roles", "list schedule", "list schedule", ONE_STREAM, ONE_STREAM] * 2
    m = measured.measurement
    assert m is not None and m.chosen == "list schedule"
    assert "roles 1.25x of one stream" in m.reason and "list schedule 1.67x" in m.reason
    assert measured([0]) == "list schedule" and list(measured.candidates) == ["list schedule"]


def test_each_size_range_is_measured_and_decided_on_its_own() -> None:
    decided: list[Measurement] = []
    # the placement is faster at one size range only: each range keeps its own
    measured, log = _sized({PLACED: [8.0], ONE_STREAM: [10.0]}, on_decided=decided.append)
    for _ in range(8):
        measured(["decode"])
    assert [m.size_range for m in decided] == ["decode"] and decided[0].chosen == PLACED
    log.clear()
    assert measured(["decode"]) == PLACED and log == [PLACED]  # decided: no more measuring
    # a new range measures from its first call, then keeps its own decision
    for _ in range(8):
        measured(["prefill"])
    assert [m.size_range for m in decided] == ["decode", "prefill"]
    assert set(measured.candidates) == {PLACED, ONE_STREAM}  # a later range may need either
    ranges = measured.measurements.ranges
    assert list(ranges) == ["decode", "prefill"] and measured.measurements.decided
    assert measured.measurement is ranges["prefill"]
    assert "decode: kept streams as placed" in measured.measurements.describe()


def test_a_stored_decision_is_kept_without_measuring() -> None:
    stored = Measurement(2, 0.05, {ONE_STREAM: [10, 10], PLACED: [8, 8]}, PLACED, "why", "decode")
    stored.stored = True
    decided: list[Measurement] = []
    measured, log = _sized(
        {PLACED: [8.0], ONE_STREAM: [10.0]}, known={"decode": stored}, on_decided=decided.append
    )
    assert measured.measurements.ranges == {"decode": stored}  # shown before any call
    for _ in range(5):
        assert measured(["decode"]) == PLACED
    assert log == [PLACED] * 5 and decided == []
    assert "decode: kept streams as placed (stored): why" in stored.describe()
    measured(["prefill"])  # an unknown range is measured
    assert measured.measurements.ranges["prefill"].chosen is None


def test_a_more_complex_placement_must_beat_a_simpler_one_by_the_gain() -> None:
    # simplest first: "balanced" passes against one stream; "interleaved" is 2% faster than it,
    # within noise, so the simpler one stays; at 10% faster the complex one is kept
    for interleaved, kept in ((7.84, "balanced"), (7.2, "interleaved")):
        m = Measurement(
            3,
            0.05,
            {ONE_STREAM: [10, 10, 10], "balanced": [8, 8, 8], "interleaved": [interleaved] * 3},
        )
        assert decide(m)[0] == kept


def test_a_decision_reads_back_as_it_was_stored() -> None:
    m = Measurement(
        2, 0.05, {ONE_STREAM: [0.01, 0.02], PLACED: [0.005, 0.006]}, size_range="s0 in 4..7"
    )
    m.chosen, m.reason = decide(m)
    back = Measurement.from_dict(m.as_dict())
    assert (back.chosen, back.reason, back.seconds, back.size_range) == (
        m.chosen,
        m.reason,
        m.seconds,
        m.size_range,
    )
    assert back.stored and not m.stored


def test_a_warm_up_calls_one_size_in_every_range_up_to_the_largest() -> None:
    from airstream.runtime.size_ranges import SizeRanges, one_size_per_range

    assert one_size_per_range(None, 512) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert one_size_per_range(None, 100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert one_size_per_range((1, 256), 512) == [1, 2, 257, 512]
    assert one_size_per_range((1, 256), 8) == [1, 2, 8]
    # every range from 1 to the top has a size, and no size falls outside them
    ranges = SizeRanges((), None)
    called = {ranges.range_of(n) for n in one_size_per_range(None, 300)}
    assert called == {ranges.range_of(n) for n in range(1, 301)}
