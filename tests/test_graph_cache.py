"""torch.compile's restart with airstream's backend (airstream.compiler.graph_cache): an inference
graph is kept in AOTAutograd's cache and a later compile of the same graph, options and passes loads
it (its passes do not run again) and runs it on the same streams; anything else compiles.

Each test's pass closes over a value of its own (``_NONCE``), which is in the key, so no entry
from an earlier run of the suite serves its first compile.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import textwrap
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of, ops_by_stream, slow
from tests.test_measured import TwoBranches

import airstream
from airstream.graph.streams import STREAM_KEY
from airstream.passes import module_paths
from airstream.runtime.measured import ONE_STREAM, PLACED

_NONCE = uuid.uuid4().hex  # in each pass's identity: this run's entries are its own


class Runs:
    """The calls of a test's pass, keyed by its type only (a list's contents, which grow with
    each compile, would be in the key)."""

    key_by_type_only = True

    def __init__(self) -> None:
        self.calls: list[str] = []

    def append(self, nonce: str) -> None:
        self.calls.append(nonce)

    def __len__(self) -> int:
        return len(self.calls)


def _side_pass(runs: Runs, nonce: str = _NONCE) -> Any:
    """A user pass putting the sin branch on stream ``side``; ``runs`` counts its calls."""

    def side_branch(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        runs.append(nonce)
        sin = next((n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default), None)
        if sin is None:  # a backward graph
            return
        mm = sin.args[0]  # the right branch's matrix multiply, on the side stream with it
        with gm.graph.inserting_before(mm):
            gm.graph.call_function(torch.ops.air.scope_enter, (["_user_stream_label"], ["side"]))
        with gm.graph.inserting_after(sin):
            gm.graph.call_function(torch.ops.air.scope_exit, ())

    return side_branch


def _config(runs: Runs, nonce: str = _NONCE) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _side_pass(runs, nonce)
    return config


def _compile_and_check(
    model: torch.nn.Module, config: airstream.CompilerConfig, **kwargs: Any
) -> airstream.CompiledGraph:
    torch.compiler.reset()
    compiled, backend = compile_model(model, config, **kwargs)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (graph,) = backend.graphs
    return graph


@pytest.mark.usefixtures("default_mode")
def test_a_second_compile_loads_the_graph_on_its_streams_without_running_the_passes() -> None:
    model = TwoBranches().eval()
    runs = Runs()
    first = _compile_and_check(model, _config(runs))
    assert (first.loaded, len(runs), first.mode) == (False, 1, "max-autotune")
    second = _compile_and_check(model, _config(runs))  # a new backend, as a new process has
    assert second.loaded and len(runs) == 1 and second.passes == ()
    assert second.kind == "inference" and second.mode == "max-autotune"
    assert ops_by_stream(second) == ops_by_stream(first)
    assert (torch.ops.aten.sin.default, "side") in ops_by_stream(second)
    assert {s.segment.stream for s in second.segments if s.node is not None} == {None, "side"}


def test_the_first_compile_on_a_machine_keys_its_entry_with_the_costs_it_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """auto_streams measures the machine's stream costs at its first compile on a machine. The
    key, computed before the passes run, used to hold no costs, so the next process (costs on
    disk) missed that entry once: the costs are now measured before the key."""
    from airstream import passes
    from airstream.machine import calibration

    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path))  # no costs measured here yet
    monkeypatch.setenv("AIRSTREAM_COSTS", "measured")
    monkeypatch.setattr(calibration, "_memo", {})
    measured: list[int] = []

    def measure(threads: int) -> calibration.MachineCosts:  # this machine's figures, made up
        measured.append(threads)
        return dataclasses.replace(calibration.NOMINAL, dispatch_seconds=7.5e-6)

    monkeypatch.setattr(calibration, "_measure_in_child", measure)
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = passes.auto_streams(min_gain=0)
    model = TwoBranches().eval()
    assert not _compile_and_check(model, config).loaded and len(measured) == 1
    assert _compile_and_check(model, config).loaded  # the costs on disk: the same key
    assert len(measured) == 1


def test_other_options_or_another_pass_compile_anew() -> None:
    model = TwoBranches().eval()
    runs = Runs()
    compiled = _compile_and_check(model, _config(runs))
    assert not compiled.loaded
    threads = _config(runs)
    threads.stream_config.threads_per_stream = 2
    assert not _compile_and_check(model, threads).loaded
    assert not _compile_and_check(model, _config(runs, nonce=_NONCE + "-edited")).loaded
    loaded = _compile_and_check(model, _config(runs))
    assert loaded.loaded and len(runs) == 3
    # what explain, dumps and messages read of each node survives the load
    assert _paths(loaded) == _paths(compiled) and ["right"] in _paths(loaded)


def _paths(graph: airstream.CompiledGraph) -> list[list[str]]:
    nodes = graph.graph_module.graph.nodes
    return [module_paths(n) for n in nodes if n.op == "call_function" and module_paths(n)]


def test_airstream_is_never_served_inductors_entry_for_the_same_graph() -> None:
    model = TwoBranches().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.compile(model)(x)  # Inductor's entry for the graph
        torch.compiler.reset()
        compiled, backend = compile_model(model, airstream.CompilerConfig())
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    (graph,) = backend.graphs  # airstream's graph (an Inductor entry would report none)
    assert graph.kind == "inference"


def test_training_graphs_and_debug_options_are_compiled_every_time(tmp_path: Path) -> None:
    model = TwoBranches()
    runs = Runs()
    for _ in range(2):
        torch.compiler.reset()
        compiled, backend = compile_model(model, _config(runs))
        compiled(torch.randn(4, 16)).sum().backward()
        assert {(g.kind, g.loaded) for g in backend.graphs} == {
            ("forward", False),
            ("backward", False),
        }
    dumping = _config(runs)
    dumping.debug.graph_dump.type = "txt"
    dumping.debug.graph_dump.path = str(tmp_path)
    for _ in range(2):
        assert not _compile_and_check(model.eval(), dumping).loaded
    assert len(runs) == 2 * 2 + 2  # training: the forward's and the backward's, each time


def test_a_graph_holding_objects_that_cannot_be_saved_compiles_every_time_quietly() -> None:
    stream = torch.Stream(device="cpu")
    runs = Runs()

    def model(x: torch.Tensor) -> torch.Tensor:
        with stream:  # the model's own stream object: in the graph, and not picklable
            y = torch.sin(x) * 2
        return y + 1

    for _ in range(2):
        torch.compiler.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no warning that it was not saved
            compiled, backend = compile_model(model, _config_noop(runs))
            x = torch.randn(8)
            with torch.no_grad():
                assert_same(compiled(x), torch.sin(x) * 2 + 1)
        (graph,) = backend.graphs
        assert not graph.loaded
        assert any(n.meta.get(STREAM_KEY) is not None for n in graph.graph_module.graph.nodes)
    assert len(runs) == 2


def _config_noop(runs: Runs, nonce: str = _NONCE) -> airstream.CompilerConfig:
    def counted(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        runs.append(nonce)

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = counted
    return config


_PROGRAM = """
import json, os, sys, torch, airstream
from tests.test_graph_cache import Runs, _config
from tests.test_measured import TwoBranches

os.environ.pop("AIRSTREAM_MODE", None)  # the tests' conftest pins one; users' is the default

torch.manual_seed(0)
model = TwoBranches().eval()
runs = Runs()
backend = airstream.get_backend(_config(runs, nonce=sys.argv[1]))
x = torch.randn(4, 16)
with torch.no_grad():
    out = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
(graph,) = backend.graphs
print(json.dumps({"loaded": graph.loaded, "passes_ran": len(runs),
                  "streams": sorted(str(s.segment.stream) for s in graph.segments)}))
"""


@slow(
    "two new processes, each importing torch and compiling",
    "tests/test_graph_cache.py::test_a_second_compile_loads_the_graph_on_its_streams_without_running_the_passes",
)
def test_a_new_process_loads_what_the_first_saved(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text(textwrap.dedent(_PROGRAM))
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}

    def run() -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, str(tmp_path / "program.py"), f"{_NONCE}-process"],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return report

    assert run() == {"loaded": False, "passes_ran": 1, "streams": ["None", "side"]}
    assert run() == {"loaded": True, "passes_ran": 0, "streams": ["None", "side"]}


@pytest.mark.usefixtures("default_mode")
def test_a_measured_placement_is_loaded_and_measured_again(
    finished_graphs: list[torch.fx.GraphModule],
) -> None:
    model = TwoBranches().eval()
    config = _config(Runs(), nonce=f"{_NONCE}-measured")
    config.stream_config.measure_placement = True
    config.stream_config.measure_calls = 2
    for expect_loaded in (False, True):
        finished_graphs.clear()
        torch.compiler.reset()
        compiled, backend = compile_model(model, config)
        with torch.no_grad():
            for step in range(4 * 2 + 2):  # 2 timed calls of each candidate, then decided
                x = torch.randn(4, 16, generator=torch.Generator().manual_seed(step))
                assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        graph = graph_of(backend, "inference")
        assert graph.loaded is expect_loaded
        assert len(finished_graphs) == 2  # the placement and one stream, on load as well
        measured = graph.measurement
        assert measured is not None and measured.chosen in (ONE_STREAM, PLACED)
        assert {k: len(v) for k, v in measured.seconds.items()} == {ONE_STREAM: 2, PLACED: 2}


@slow(
    "Qwen2-MoE compiled twice in the default mode (21 s with Inductor's cache empty)",
    "tests/test_graph_cache.py::test_a_second_compile_loads_the_graph_on_its_streams_without_running_the_passes",
)
@pytest.mark.usefixtures("default_mode")
def test_a_transformers_moe_is_loaded_with_its_auto_streams_placement() -> None:
    """Real model code in the mode users get: Qwen2-MoE's forward (random weights, a static KV
    cache), auto_streams placing it; the second compile loads the graph with the same streams
    and gives eager's logits and cache."""
    transformers = pytest.importorskip("transformers")
    from airstream import passes
    from airstream.selftest.architectures import ARCHS

    model = ARCHS["qwen2_moe"].build().eval()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    # transformers renamed past_key_values to cache (5.24 warns on the old name)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    runs = Runs()
    graphs = []
    for _ in range(2):
        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = passes.auto_streams(max_streams=2, min_gain=0)
        counted = _config_noop(runs, f"{_NONCE}-moe").post_grad_custom_pre_pass
        config.post_grad_custom_post_pass = counted  # this run's own key
        config.stream_config.measure_placement = False  # the placement as the pass left it
        torch.compiler.reset()
        compiled, backend = compile_model(model.forward, config)
        got_cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        want_cache = transformers.StaticCache(config=model.config, max_cache_len=16)
        with torch.no_grad():
            got = compiled(ids, **{name: got_cache}, use_cache=True)
            want = model(ids, **{name: want_cache}, use_cache=True)
        assert_same(got.logits, want.logits, rtol=1e-4, atol=1e-4)
        for mine, theirs in zip(got_cache.layers, want_cache.layers, strict=True):
            assert_same(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)
        graphs.append(graph_of(backend, "inference"))
    compiled_graph, loaded = graphs
    assert not compiled_graph.loaded and loaded.loaded and len(runs) == 1
    assert loaded.mode == "max-autotune"
    assert compiled_graph.streams.side_streams  # auto_streams placed something off main
    assert ops_by_stream(loaded) == ops_by_stream(compiled_graph)
