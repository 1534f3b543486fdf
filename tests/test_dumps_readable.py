"""Dumps that explain themselves: fresh numbering per run, op names people write, markers drawn
attached to what they bracket or order, absolute paths, scope markers on one stream."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.conftest import compile_model, graph_of
from torch.fx.experimental.proxy_tensor import make_fx

import airstream
from airstream.cli.demo import run_demo
from airstream.debug import dump
from airstream.examples.guide import Model, custom_pre_pass

_ATTRS = re.compile(r'(\w+)=(?:"((?:[^"\\]|\\.)*)"|([^,\s\]]+))')
_NODE = re.compile(r'^\s*"([^"]+)" \[(.*)\];$')
_EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)"(?: \[(.*)\])?;$')


def _attrs(text: str) -> dict[str, str]:
    """``key=value`` pairs of one DOT attribute list, quoted or not."""
    return {key: quoted or bare for key, quoted, bare in _ATTRS.findall(text)}


def _parse_dot(
    text: str,
) -> tuple[dict[str, dict[str, str]], list[tuple[str, str, dict[str, str]]]]:
    """Nodes (name -> attributes) and edges (tail, head, attributes) of our DOT output."""
    nodes: dict[str, dict[str, str]] = {}
    edges: list[tuple[str, str, dict[str, str]]] = []
    for line in text.splitlines():
        if m := _EDGE.match(line):
            edges.append((m[1], m[2], _attrs(m[3] or "")))
        elif m := _NODE.match(line):
            nodes[m[1]] = _attrs(m[2])
    return nodes, edges


def _dot_of(directory: Path, suffix: str) -> str:
    return next(p for p in sorted(directory.iterdir()) if p.name.endswith(suffix)).read_text()


def _guide_config(kind: str, path: Path) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    config.debug.graph_dump.type = kind
    config.debug.graph_dump.path = str(path)
    return config


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private airstream cache, where dump manifests go."""
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _numbered(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if re.match(r"\d+_", p.name))


def test_rerun_replaces_its_own_numbered_files_and_keeps_others(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "dumps"
    compiled, _ = compile_model(Model(), _guide_config("txt", out))
    compiled(torch.randn(3, 3))
    first = _numbered(out)
    assert first[0].startswith("000_") and first[-1].endswith("_summary.txt"), first
    (out / "notes.txt").write_text("mine")
    (out / "000_dynamo.txt").write_text("stale")  # the next run must rewrite it
    monkeypatch.setattr(dump, "_numbers", {})  # a new process: no counters yet
    torch.compiler.reset()
    compiled, _ = compile_model(Model(), _guide_config("txt", out))
    compiled(torch.randn(3, 3))
    assert _numbered(out) == first, "a rerun numbers from 000 again, not after the old files"
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "000_dynamo.txt").read_text().startswith("# dynamo")
    assert sorted(p.name for p in out.iterdir()) == sorted([*first, "notes.txt"])


def test_new_run_never_deletes_files_it_did_not_write(tmp_path: Path, cache: Path) -> None:
    out = tmp_path / "dumps"
    out.mkdir()
    foreign = out / "007_dynamo.txt"  # named like a dump, written by someone else
    foreign.write_text("not airstream's")
    dump.start_run(str(out))
    dumper = dump.GraphDumper("txt", str(out))
    gm = torch.fx.symbolic_trace(lambda x: x.sin())
    written = dumper.dump("dynamo", "", gm)
    assert foreign.read_text() == "not airstream's"
    assert written is not None and os.path.basename(written) == "008_dynamo.txt"
    # Another process still writing to the directory (another rank): its files stay.
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        manifest = Path(dump._manifest(str(out)))
        manifest.write_text(f"{owner.pid}\n{out}\n008_dynamo.txt\n")
        dump.start_run(str(out))
        assert (out / "008_dynamo.txt").exists()
    finally:
        owner.kill()
        owner.wait()
    manifest.write_text(f"{os.getpid()}\n{out}\n008_dynamo.txt\n")  # our own earlier run
    dump.start_run(str(out))
    assert sorted(p.name for p in out.iterdir()) == ["007_dynamo.txt"]


def test_manifests_of_removed_directories_are_pruned(tmp_path: Path, cache: Path) -> None:
    gone, kept = tmp_path / "gone", tmp_path / "kept"
    stale = Path(dump._manifest(str(gone)))
    stale.parent.mkdir(parents=True)
    stale.write_text(f"1\n{gone}\n000_dynamo.txt\n")
    dump.start_run(str(kept))
    own = Path(dump._manifest(str(kept)))
    assert sorted(cache.glob("dumps/*")) == [own]
    assert own.read_text().split("\n")[:2] == [str(os.getpid()), str(kept.resolve())]


def test_nodes_are_labelled_with_aten_and_torch_names(tmp_path: Path, cache: Path) -> None:
    compiled, _ = compile_model(Model(), _guide_config("dot", tmp_path))
    compiled(torch.randn(3, 3))
    dynamo, _ = _parse_dot(_dot_of(tmp_path, "_dynamo.dot"))
    ops = {
        name: attrs["label"].split("\\n")[1]
        for name, attrs in dynamo.items()
        if attrs.get("shape") is None and not name.startswith("legend_")
    }
    assert sorted(ops.values()) == ["torch.abs", "torch.add", "torch.mm", "torch.sub"], ops
    plan, _ = _parse_dot(_dot_of(tmp_path, "_inference_plan.dot"))
    assert plan["mm"]["label"].split("\\n") == ["mm", "aten.mm", "[stream_1]"]
    assert plan["sub"]["label"].split("\\n") == ["sub", "aten.sub.Tensor", "[main]"]
    assert not any("_VariableFunctionsClass" in a["label"] for a in [*dynamo.values()])


def test_markers_are_attached_to_the_nodes_they_bracket_or_order(
    tmp_path: Path, cache: Path
) -> None:
    compiled, _ = compile_model(Model(), _guide_config("dot", tmp_path))
    compiled(torch.randn(3, 3))
    nodes, edges = _parse_dot(_dot_of(tmp_path, "_inference_plan.dot"))
    dashed = {
        (a, b): attrs.get("label", "").strip()
        for a, b, attrs in edges
        if attrs.get("style") == "dashed"
    }
    assert dashed[("scope_enter_default", "mm")] == "first"
    assert dashed[("abs_1", "record_default")] == "after"
    assert dashed[("record_default", "scope_exit_default")] == "last"
    assert dashed[("record_default", "wait_default")] == "control"
    assert dashed[("wait_default", "sub")] == "then"
    linked = {name for edge in edges for name in edge[:2]}
    markers = [n for n in nodes if n.split("_")[0] in ("scope", "record", "wait")]
    assert len(markers) == 4 and set(markers) <= linked, "no marker floats unattached"


def test_nested_and_empty_scopes_are_attached() -> None:
    from airstream.debug.dot import to_dot

    air = torch.ops.air

    def f(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter(["_user_stream_label"], ["outer"])
        air.scope_enter(["_user_stream_label"], ["inner"])
        y = x.cos()
        air.scope_exit()
        air.scope_enter(["_user_stream_label"], ["empty"])
        air.scope_exit()
        air.scope_exit()
        return y.neg()

    gm = make_fx(f, tracing_mode="fake")(torch.randn(2))
    _, edges = _parse_dot(to_dot(gm, None))
    order = {(a, b): attrs["label"].strip() for a, b, attrs in edges if "label" in attrs}
    assert order[("scope_enter", "scope_enter_1")] == "first"  # outer opens with inner
    assert order[("scope_enter_1", "cos")] == "first"
    assert order[("cos", "scope_exit")] == "last"
    assert order[("scope_enter_2", "scope_exit_1")] == "empty scope"
    assert order[("scope_exit_1", "scope_exit_2")] == "last"  # outer closes after empty


class _Annotated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("side"):
            y = torch.relu(self.a(x))
        return y + x


def test_scope_markers_are_on_the_same_stream_in_every_model() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    compiled, guide = compile_model(Model(), config)
    compiled(torch.randn(3, 3))
    torch.compiler.reset()
    compiled, annotated = compile_model(_Annotated())
    with torch.no_grad():
        compiled(torch.randn(2, 4))
    for backend, side in ((guide, "stream_1"), (annotated, "side")):
        graph = graph_of(backend, "inference")
        markers = {
            str(n.target).split(".")[1]: graph.streams.stream(n)
            for n in graph.graph_module.graph.nodes
            if str(n.target).startswith("air.scope_")
        }
        assert markers == {"scope_enter": None, "scope_exit": None}, markers
        assert "scope_exit" not in " ".join(graph.streams.nodes_on(side))


def test_demo_prints_every_path_absolute_and_reruns_fresh(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    reports = []
    for _ in range(2):
        torch.compiler.reset()
        text, ok = run_demo(size=8, out_dir="out")
        assert ok
        reports.append(text)
    listed = [
        line.split()[1]
        for line in reports[1].split("== files written ==\n", 1)[1].split("\n==", 1)[0].splitlines()
    ]
    assert listed and all(os.path.isabs(p) and os.path.exists(p) for p in listed), listed
    dumps = [os.path.basename(p) for p in listed if "/dumps/" in p]
    assert dumps[0].startswith("000_"), dumps
    assert sorted(os.listdir(tmp_path / "out" / "dumps")) == sorted(dumps)
