"""Seeing the streams: profiler, Chrome trace, SVG timeline, graph dumps, explain."""

from __future__ import annotations

import json
import os
import shutil
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import torch
from tests import probe_ops
from tests.conftest import compile_model

import airstream
from airstream import torch_internals
from airstream.cli import main
from airstream.examples.guide import Model, custom_pre_pass

graph_break = torch_internals.dynamo_graph_break()


def _guide(**options: Any) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    for path, value in options.items():
        config.set_option(path.replace("__", "."), value)
    return config


def _team_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("openmp-team-")]


def test_profile_of_the_design_example() -> None:
    compiled, _ = compile_model(Model(), _guide())
    x = torch.randn(128, 128)
    compiled(x)
    with airstream.profile() as prof:
        for _ in range(3):
            compiled(x)
    assert len(prof.calls) == 3
    for call, _, _ in prof.calls:
        ops = {r.name: r for r in prof.events if r.call == call}
        assert ops["mm"].stream == "stream_1" and ops["abs_1"].stream == "stream_1"
        assert ops["add"].stream is None and ops["sub"].stream is None
        assert ops["sub"].start_ns >= ops["abs_1"].end_ns, "sub starts after abs has finished"
        # a worker of its own, or a thread of the caller's OpenMP team (the default on GNU OpenMP)
        assert ops["mm"].thread in ("airstream-stream-stream_1", *_team_threads())
        assert ops["add"].thread == threading.current_thread().name
    assert all(w.stream is None and w.end_ns >= w.start_ns for w in prof.waits)
    stats = prof.stats()
    assert set(stats) == {None, "stream_1"} and stats["stream_1"].busy_ns > 0
    summary = prof.summary()
    assert "stream_1" in summary and "overlap" in summary


def test_chrome_trace_is_valid_trace_event_json(tmp_path: Path) -> None:
    compiled, _ = compile_model(Model(), _guide())
    x = torch.randn(32, 32)
    compiled(x)
    with airstream.profile() as prof:
        compiled(x)
        compiled(x)
    path = prof.export_chrome_trace(tmp_path / "trace.json")
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"stream main", "stream stream_1"}
    complete = [e for e in events if e["ph"] == "X"]
    assert {"mm", "abs_1", "add", "sub"} <= {e["name"] for e in complete}
    assert all(e["dur"] > 0 and "ts" in e and "tid" in e for e in complete)
    starts = {e["id"] for e in events if e["ph"] == "s"}
    finishes = {e["id"] for e in events if e["ph"] == "f"}
    assert starts and starts == finishes, "each flow arrow goes from a record to a wait"


def test_svg_timeline_is_well_formed_with_a_lane_per_stream(tmp_path: Path) -> None:
    compiled, _ = compile_model(Model(), _guide())
    x = torch.randn(32, 32)
    compiled(x)
    with airstream.profile() as prof:
        compiled(x)
    root = ET.parse(prof.export_svg(tmp_path / "t.svg")).getroot()
    lanes = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "lane"]
    assert [g.get("data-stream") for g in lanes] == ["main", "stream_1"]


class _Raises(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            a = torch.ops.airstream_test.fail_if_negative(x)
        return a + x.cos()


def test_profiling_a_call_that_raises_leaves_the_profiler_usable() -> None:
    assert probe_ops.fail_if_negative is not None
    compiled, _ = compile_model(_Raises())
    good = torch.rand(8)
    compiled(good)
    with airstream.profile() as prof:
        with pytest.raises(ValueError, match="negative input"):
            compiled(-good)
        compiled(good)
    assert len(prof.calls) == 2
    assert {r.name for r in prof.events if r.call == prof.calls[1][0]} >= {"fail_if_negative"}
    with airstream.profile() as again:
        compiled(good)
    assert len(again.calls) == 1


def test_record_function_ranges_on_every_stream_under_torch_profiler() -> None:
    compiled, _ = compile_model(Model(), _guide())
    x = torch.randn(64, 64)
    compiled(x)
    config = torch_internals.profile_all_threads_config()
    with torch.profiler.profile(experimental_config=config) as prof:
        compiled(x)
    names = {e.name for e in prof.events()}
    assert {"stream_1:mm", "stream_1:abs_1", "main:add", "main:sub"} <= names


def test_svg_without_graphviz_writes_dot_files_with_one_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airstream.debug import dump

    monkeypatch.setattr(dump.shutil, "which", lambda name: None)
    dump.warn_no_graphviz.cache_clear()
    config = airstream.CompilerConfig()
    config.debug.graph_dump.type = "svg"
    config.debug.graph_dump.path = str(tmp_path)
    with pytest.warns(UserWarning) as seen:
        for size in (3, 5):  # two compiles, a dozen dumps
            compiled, _ = compile_model(Model(), config, dynamic=False)
            compiled(torch.randn(size, size))
    notices = [w for w in seen if "Graphviz" in str(w.message)]
    assert len(notices) == 1, [str(w.message) for w in seen]
    assert "apt-get install graphviz" in str(notices[0].message)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) > 6 and not any(f.endswith(".svg") for f in files), files
    assert any(f.endswith("_plan.dot") for f in files), files
    dump.warn_no_graphviz.cache_clear()


@pytest.mark.parametrize("kind", ["txt", "py", "dot", "svg"])
def test_dumps_in_documented_order_for_all_graph_kinds(kind: str, tmp_path: Path) -> None:
    if kind == "svg" and shutil.which("dot") is None:
        pytest.skip("Graphviz not installed")
    config = airstream.CompilerConfig()
    config.debug.graph_dump.type = kind
    config.debug.graph_dump.path = str(tmp_path)
    lin = torch.nn.Linear(4, 4)

    def model(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s1"):
            y = lin(x).relu()
        return y * 2

    compiled, _ = compile_model(model, config)
    compiled(torch.randn(2, 4)).sum().backward()
    with torch.no_grad():
        torch.compiler.reset()
        compiled2, _ = compile_model(model, config)
        compiled2(torch.randn(2, 4))
    ext = {"txt": "txt", "py": "py"}.get(kind, kind)
    files = sorted(os.listdir(tmp_path))
    steps = [f.split("_", 1)[1].rsplit(".", 1)[0] for f in files]
    expected = ["dynamo"]
    for graph in ("forward", "backward"):
        expected += [
            f"{graph}_after_aot",
            f"{graph}_after_builtin",
            f"{graph}_plan",
            f"{graph}_summary",
        ]
    expected += [
        "dynamo",
        "inference_after_aot",
        "inference_after_builtin",
        "inference_plan",
        "inference_summary",
    ]
    assert steps == expected
    assert all(f.endswith(f".{ext}") or f.endswith("summary.txt") for f in files)
    numbers = [int(f.split("_", 1)[0]) for f in files]
    assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers)


def test_dot_dump_has_dashed_record_to_wait_edge_and_stream_colours(tmp_path: Path) -> None:
    compiled, _ = compile_model(
        Model(), _guide(debug__graph_dump__type="dot", debug__graph_dump__path=str(tmp_path))
    )
    compiled(torch.randn(4, 4))
    plan = next(f for f in os.listdir(tmp_path) if f.endswith("inference_plan.dot"))
    dot = (tmp_path / plan).read_text()
    assert '"record_default" -> "wait_default" [style=dashed' in dot
    assert 'label="sync e0 (data)"' in dot
    assert "cluster_legend" in dot and 'label="stream_1"' in dot
    assert 'tooltip="' in dot and "guide.py:19" in dot


def test_svg_without_graphviz_writes_dot_and_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    compiled, _ = compile_model(
        Model(), _guide(debug__graph_dump__type="svg", debug__graph_dump__path=str(tmp_path))
    )
    with pytest.warns(UserWarning, match="needs Graphviz's `dot`"):
        compiled(torch.randn(4, 4))
    assert any(f.endswith(".dot") for f in os.listdir(tmp_path))
    assert not any(f.endswith(".svg") for f in os.listdir(tmp_path))


def broken_pass(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    raise RuntimeError("boom")


def test_pass_failure_dumps_the_graph_from_before_the_pass(tmp_path: Path) -> None:
    config = _guide(debug__graph_dump__type="txt", debug__graph_dump__path=str(tmp_path))
    config.post_grad_custom_post_pass = broken_pass
    compiled, _ = compile_model(Model(), config)
    with pytest.raises(Exception) as info:
        compiled(torch.randn(3, 3))
    message = str(info.value)
    assert "The graph from before this pass is in" in message
    path = message.split("The graph from before this pass is in ", 1)[1].split()[0]
    assert os.path.exists(path) and "before_broken_pass" in path
    assert "stream_1  mm = aten.mm.default" in Path(path).read_text()


def test_explain_reports_without_running(monkeypatch: pytest.MonkeyPatch) -> None:
    probe_ops.SEEN.clear()

    class Probed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("tiny"):
                a = torch.ops.airstream_test.probe(x, "explain")
            return a + 1

    report = airstream.explain(Probed(), torch.randn(4))
    assert probe_ops.SEEN == [], "explain compiled without running the model"
    text = str(report)
    assert "after AOTAutograd" in text and "after builtin" in text
    assert "tiny" in text and "syncs:" in text
    assert any("stream 'tiny' runs 1 op(s)" in w for w in report.warnings)
    compiled, _ = compile_model(Probed())
    compiled(torch.randn(4))  # the model still compiles and runs normally afterwards
    assert [tag for tag, _, _ in probe_ops.SEEN] == ["explain"]


def test_explain_reports_a_graph_break() -> None:
    def with_break(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        graph_break()
        return y.cos()

    report = airstream.explain(with_break, torch.randn(3))
    assert report.graph_breaks == 1 and "graph break" in " ".join(report.warnings)
    assert len(report.graphs) == 1


def test_explain_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "airstream.examples.guide:explain_target"]) == 0
    out = capsys.readouterr().out
    assert "stream_1  mm = aten.mm.default" in out and "e0: abs_1 [stream_1] -> add [main]" in out
    assert main(["explain", "airstream.examples.guide"]) == 2


def test_demo_writes_dumps_and_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--size", "16", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "files written" in out and "trace.json" in out and "timeline.svg" in out
    assert (tmp_path / "trace.json").exists() and (tmp_path / "timeline.svg").exists()
    assert any(
        f.endswith("inference_plan.svg") or f.endswith("inference_plan.dot")
        for f in os.listdir(tmp_path / "dumps")
    )


def test_profile_unregisters_on_exit() -> None:
    from airstream.runtime import trace

    assert not trace.tracing_wanted()
    with airstream.profile():
        assert trace.tracing_wanted()
    assert not trace.tracing_wanted(), "a finished profile must stop tracing calls"


def test_data_dump_writes_each_ops_inputs_and_outputs_per_call(tmp_path: Path) -> None:
    import numpy as np

    config = airstream.CompilerConfig()
    config.debug.data_dump.type = "npy"
    config.debug.data_dump.path = str(tmp_path)
    config.debug.data_dump.filter = lambda node: None if node.name.startswith("sub") else node
    compiled = torch.compile(
        lambda x, y: (x + y).sub(1), backend=airstream.get_backend(compiler_config=config)
    )
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    torch.testing.assert_close(compiled(x, y), (x + y).sub(1))
    compiled(x, y)
    rank = tmp_path / "worldsize1_global_rank0"
    (graph,) = rank.iterdir()
    assert graph.name.startswith("graph_")
    assert sorted(p.name for p in graph.iterdir()) == ["0", "1"], "one folder per call"
    files = sorted(p.name for p in (graph / "0").iterdir())
    assert len(files) == 3, files  # add: two inputs, one output; sub filtered out
    assert all(f.startswith("add-aten.add.Tensor.") and f.endswith(".npy") for f in files)
    out = next(f for f in files if ".OUTPUT.0." in f)
    np.testing.assert_allclose(np.load(graph / "0" / out), (x + y).numpy())


def test_data_dump_into_a_file_raises_on_the_first_call(tmp_path: Path) -> None:
    config = airstream.CompilerConfig()
    config.debug.data_dump.type = "npy"
    (tmp_path / "file").write_text("")
    config.debug.data_dump.path = str(tmp_path / "file")
    compiled = torch.compile(lambda x: x * 2, backend=airstream.get_backend(compiler_config=config))
    with pytest.raises(NotADirectoryError):
        compiled(torch.randn(2))


def test_torchair_dump_names_and_source_lines(tmp_path: Path) -> None:
    config = airstream.CompilerConfig()
    config.debug.graph_dump.type = "py"
    config.debug.graph_dump.path = str(tmp_path)
    config.debug.graph_dump.naming = "torchair"

    def model(x: torch.Tensor) -> torch.Tensor:
        return x.sin() + 1

    torch.compile(model, backend=airstream.get_backend(compiler_config=config))(torch.randn(3))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 2, names  # only the original and the optimized graph
    assert names[0].startswith("dynamo_optimized_graph_") and names[1].startswith(
        "dynamo_original_graph_"
    )
    graph_id = names[1].split("_")[3]
    assert names[0].split("_")[3] == graph_id and "_rank_0_pid_" in names[0]
    for name in names:
        text = (tmp_path / name).read_text()
        assert "code: return x.sin() + 1" in text, text  # each node under its source line
    assert "torch.ops.aten.sin.default" in (tmp_path / names[0]).read_text()
