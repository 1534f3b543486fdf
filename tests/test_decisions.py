"""measure_placement per size range, and its decisions kept on disk
(``airstream.compiler.decisions``): a graph compiled with a dynamic size decides per range of that
size; a later compile of the same graph (a later process) reads the decisions and measures nothing
it measured before; ``airstream cache`` lists them and ``airstream explain`` shows them. Which
candidate a real clock keeps is never asserted: what runs, what is stored, and results against eager
are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, cause_of, compile_model, graph_of, slow
from tests.test_measured import TwoBranches, _config

import airstream
from airstream.cli import main
from airstream.compiler.decisions import list_decisions
from airstream.errors import ConfigError
from airstream.graph.streams import STREAM_KEY
from airstream.runtime.measured import ONE_STREAM, PLACED
from airstream.runtime.size_ranges import SizeRanges, SizeSource


@pytest.fixture
def on_disk(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Decisions kept, in a cache directory of the test's own."""
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AIRSTREAM_DECISIONS", "disk")
    return tmp_path / "decisions"


def _calls(compiled: Any, model: torch.nn.Module, rows: int, count: int) -> None:
    with torch.no_grad():
        for step in range(count):
            x = torch.randn(rows, 16, generator=torch.Generator().manual_seed(step))
            assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)


def test_ranges_are_powers_of_two_or_the_users_bounds() -> None:
    source = SizeSource("s0", 1, 0)
    pow2 = SizeRanges([source], None)
    assert [pow2.range_of(n) for n in (0, 1, 2, 3, 4, 7, 8, 300)] == [
        "0",
        "1",
        "2..3",
        "2..3",
        "4..7",
        "4..7",
        "8..15",
        "256..511",
    ]
    cut = SizeRanges([source], (256, 1))
    assert [cut.range_of(n) for n in (1, 2, 256, 257, 10**6)] == [
        "0..1",
        "2..256",
        "2..256",
        "257..",
        "257..",
    ]
    assert pow2([None, torch.empty(5, 3)]) == "s0 in 4..7"  # read from input 1's dim 0
    assert cut.describe() == "s0 (input 1, dim 0) by bounds [1, 256]"


def test_a_dynamic_graph_decides_per_size_range() -> None:
    model = TwoBranches().eval()
    compiled, backend = compile_model(model, _config(), dynamic=True)
    _calls(compiled, model, 4, 8)  # 2 timed calls of each candidate, each after an untimed one
    _calls(compiled, model, 5, 3)  # the same range: decided, no measuring
    _calls(compiled, model, 64, 8)
    assert len(backend.graphs) == 1  # one graph for every size: no recompile
    graph = graph_of(backend, "inference")
    measured = graph.measurements
    assert measured is not None and measured.sizes.endswith("by powers of two")
    (symbol,) = {r.split(" in ")[0] for r in measured.ranges}
    assert list(measured.ranges) == [f"{symbol} in 4..7", f"{symbol} in 64..127"]
    for m in measured.ranges.values():
        assert m.chosen in (ONE_STREAM, PLACED)
        assert {k: len(v) for k, v in m.seconds.items()} == {ONE_STREAM: 2, PLACED: 2}
    assert graph.measurement is measured.ranges[f"{symbol} in 64..127"]  # the latest


def test_user_bounds_make_one_range_of_sizes_powers_of_two_would_split() -> None:
    model = TwoBranches().eval()
    config = _config()
    config.stream_config.measure_ranges = [16, 1]
    assert config.stream_config.measure_ranges == (1, 16)
    compiled, backend = compile_model(model, config, dynamic=True)
    _calls(compiled, model, 2, 8)
    _calls(compiled, model, 9, 2)  # 2..16 as well: decided
    measured = graph_of(backend, "inference").measurements
    assert measured is not None and [r.split(" in ")[1] for r in measured.ranges] == ["2..16"]


def test_decisions_are_kept_and_a_later_compile_measures_nothing(on_disk: Path) -> None:
    model = TwoBranches().eval()
    compiled, backend = compile_model(model, _config(), dynamic=True)
    _calls(compiled, model, 4, 8)
    _calls(compiled, model, 64, 8)
    first = graph_of(backend, "inference").measurements
    assert first is not None and first.decided
    (stored,) = list_decisions(on_disk)
    assert "inference graph of" in stored.graph and "test_measured.py:" in stored.graph
    assert [d.size_range for d in stored.decisions] == list(first.ranges)
    assert [d.chosen for d in stored.decisions] == [m.chosen for m in first.ranges.values()]

    torch.compiler.reset()  # what a new process sees: the graph compiled again
    compiled, backend = compile_model(model, _config(), dynamic=True)
    _calls(compiled, model, 4, 3)
    again = graph_of(backend, "inference").measurements
    assert again is not None and list(again.ranges) == list(first.ranges)  # 64 not called yet
    _calls(compiled, model, 64, 3)
    for was, now in zip(first.ranges.values(), again.ranges.values(), strict=True):
        assert now.stored and (now.chosen, now.seconds) == (was.chosen, was.seconds)

    # other measuring options are another key: measured anew, kept beside the first
    torch.compiler.reset()
    compiled, backend = compile_model(model, _config(calls=3), dynamic=True)
    _calls(compiled, model, 4, 2)
    fresh = graph_of(backend, "inference").measurements
    assert fresh is not None and len(fresh.ranges) == 1
    assert fresh.current is not None and fresh.current.chosen is None
    assert len(list_decisions(on_disk)) == 1  # the new graph has decided nothing yet


def test_airstream_cache_lists_and_clears_the_decisions(
    on_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = TwoBranches().eval()
    compiled, _ = compile_model(model, _config())
    _calls(compiled, model, 4, 8)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"measured stream decisions (measure_placement): {on_disk}" in out
    assert "inference graph of" in out and "  1 graph(s)" in out
    assert "kept one stream (stored): " in out or "kept streams as placed (stored): " in out
    assert main(["cache", "--clear"]) == 0
    assert "removed the measured decisions of 1 graph(s)" in capsys.readouterr().out
    assert list_decisions(on_disk) == []


def test_explain_shows_a_graphs_stored_decisions(on_disk: Path) -> None:
    model = TwoBranches().eval()
    x = torch.randn(4, 16)
    report = str(airstream.explain(model, x, compiler_config=_config()))
    assert "measure_placement: one stream and the placement timed in turn:" in report
    assert "not measured yet: the first calls measure" in report
    compiled, _ = compile_model(model, _config())
    _calls(compiled, model, 4, 8)
    report = str(airstream.explain(model, x, compiler_config=_config()))
    assert "(stored): " in report and "pairs of calls" in report


def test_an_unwritable_store_warns_once_and_the_call_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(blocker))  # a file: no directory under it
    monkeypatch.setenv("AIRSTREAM_DECISIONS", "disk")
    model = TwoBranches().eval()
    compiled, _ = compile_model(model, _config())
    with pytest.warns(RuntimeWarning, match="could not keep a measured stream decision"):
        _calls(compiled, model, 4, 8)


@pytest.mark.parametrize("value", ["powers", (), (0, 4), (4, 4), (1.5,)])
def test_bad_bounds_are_named(value: Any) -> None:
    config = airstream.CompilerConfig()
    with pytest.raises(ConfigError) as raised:
        config.stream_config.measure_ranges = value
    error = cause_of(raised.value, ConfigError)
    assert error is not None and "stream_config.measure_ranges" in str(error)
    assert "'pow2', or the ranges' upper bounds" in str(error)


@pytest.mark.usefixtures("default_mode")
def test_in_the_default_mode_each_range_runs_its_segments() -> None:
    model = TwoBranches().eval()
    compiled, backend = compile_model(model, _config(), dynamic=True)
    _calls(compiled, model, 4, 8)
    _calls(compiled, model, 33, 8)
    graph = graph_of(backend, "inference")
    assert graph.mode == "max-autotune" and graph.fallbacks == 0
    measured = graph.measurements
    assert measured is not None and len(measured.ranges) == 2 and measured.decided


def test_a_static_graph_decided_before_compiles_only_what_it_kept(
    on_disk: Path, finished_graphs: list[torch.fx.GraphModule]
) -> None:
    finished = finished_graphs
    model = TwoBranches().eval()
    compiled, backend = compile_model(model, _config())
    _calls(compiled, model, 4, 8)
    first = graph_of(backend, "inference").measurement
    assert first is not None and first.chosen is not None and len(finished) == 2

    torch.compiler.reset()
    finished.clear()
    compiled, backend = compile_model(model, _config())
    _calls(compiled, model, 4, 2)
    graph = graph_of(backend, "inference")
    assert len(finished) == 1  # the candidate kept, and nothing else
    assert graph.measurement is not None and graph.measurement.stored
    assert graph.measurement.chosen == first.chosen
    sides = {n.meta.get(STREAM_KEY) for n in graph.graph_module.graph.nodes} - {None}
    assert sides == (set() if first.chosen == ONE_STREAM else {"side"})


@slow(
    "a transformers MoE compiled and measured per length (10 s)",
    "tests/test_decisions.py::test_in_the_default_mode_each_range_runs_its_segments",
)
def test_a_real_moe_model_decides_its_shared_expert_stream_per_length() -> None:
    from airstream.selftest.models import ARCHS, airstream_config

    arch = ARCHS["qwen2_moe"]
    model = arch.build().eval()
    config = airstream_config(arch, "shared_expert", mode="reduce-overhead")
    config.stream_config.measure_placement = True  # the hand-placed shared expert, measured
    config.stream_config.measure_calls = 2
    compiled, backend = compile_model(model, config, dynamic=True)
    with torch.no_grad():
        for length in (3, 9):  # a decode-like and a prefill-like length: two ranges
            ids = torch.randint(0, 64, (1, length), generator=torch.Generator().manual_seed(length))
            want = model(input_ids=ids).logits
            for _ in range(8):
                assert_same(compiled(input_ids=ids).logits, want, rtol=1e-4, atol=1e-4)
    graph = graph_of(backend, "inference")
    assert len(backend.graphs) == 1
    assert any(n.meta.get(STREAM_KEY) for n in graph.graph_module.graph.nodes)  # as placed
    measured = graph.measurements
    assert measured is not None and measured.decided
    assert [r.split(" in ")[1] for r in measured.ranges] == ["2..3", "8..15"]
