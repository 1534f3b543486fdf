"""auto_streams' alternatives (``passes/auto/candidates.py``): beside the placement it applies, it
proposes others (the roles, the list schedule, balanced branches) that measure_placement compiles
and times against it and one stream. Tested for what each candidate places, its order, what is
measured, stored and rebuilt, and results against eager; never for which one a real clock keeps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
from airstream import passes
from airstream.bench.moe import MoE
from airstream.compiler.decisions import list_decisions
from airstream.graph.streams import STREAM_KEY
from airstream.passes.auto.candidates import ORDER_KEY
from airstream.passes.toolkit import module_paths
from airstream.runtime.measured import ONE_STREAM, PLACED

BALANCED = "auto_streams balanced branches"


def _config(**kw: Any) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = passes.auto_streams(min_gain=0, costs="nominal", **kw)
    config.stream_config.measure_calls = 2
    return config


def _expert(node: torch.fx.Node) -> int | None:
    for path in module_paths(node):
        parts = path.split(".")
        if len(parts) >= 2 and parts[0] == "experts":
            return int(parts[1])
    return None


def _run(compiled: Any, model: torch.nn.Module, calls: int) -> None:
    with torch.no_grad():
        for step in range(calls):
            x = torch.randn(8, 256, generator=torch.Generator().manual_seed(step))
            assert_same(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_balanced_branches_keep_each_expert_whole_on_one_stream_in_graph_order(
    finished_graphs: list[torch.fx.GraphModule],
) -> None:
    model = MoE(4, 256).eval()
    compiled, backend = compile_model(model, _config())
    _run(compiled, model, 4 * 2 * 3)  # 3 candidates, 2 timed calls each after an untimed one
    decision = graph_of(backend, "inference").graph_module.meta["airstream_auto_streams"]
    assert decision.applied and decision.alternatives[0].startswith("balanced branches")
    placed, balanced, one = finished_graphs  # the placement, its alternative, one stream
    streams: dict[int, set[Any]] = {}
    for node in balanced.graph.nodes:
        expert = _expert(node)
        if expert is not None and node.op == "call_function":
            streams.setdefault(expert, set()).add(node.meta.get(STREAM_KEY))
    # each expert whole on one stream, the weight's transpose too; two experts per stream
    assert all(len(s) == 1 for s in streams.values()), streams
    on = [next(iter(s)) for _, s in sorted(streams.items())]
    assert sorted(on, key=str) == [None, None, "auto_branch_1", "auto_branch_1"]

    # the graph's own order, from before the list schedule reordered the placement
    def places(gm: torch.fx.GraphModule) -> list[int]:
        return [n.meta[ORDER_KEY] for n in gm.graph.nodes if ORDER_KEY in n.meta]

    assert places(placed) != sorted(places(placed))  # the placement was reordered
    assert places(balanced) == sorted(places(balanced))
    assert all(n.meta.get(STREAM_KEY) is None for n in one.graph.nodes)
    measured = graph_of(backend, "inference").measurement
    assert measured is not None and measured.chosen is not None
    # simplest first: the balanced branches hand fewer values between streams than the list
    # schedule's interleaving, so a gain of the list schedule must be measured against them
    assert list(measured.seconds) == [ONE_STREAM, BALANCED, PLACED]
    assert all(len(v) == 2 for v in measured.seconds.values())


def test_no_alternative_is_proposed_when_asked_for_none(
    finished_graphs: list[torch.fx.GraphModule],
) -> None:
    model = MoE(4, 256).eval()
    compiled, backend = compile_model(model, _config(alternatives=0))
    _run(compiled, model, 1)
    assert graph_of(backend, "inference").graph_module.meta["airstream_auto_streams"].applied
    assert len(finished_graphs) == 1  # the placement: one stream compiles at its first turn
    _run(compiled, model, 2)
    assert len(finished_graphs) == 2  # the placement and one stream
    with pytest.raises(ValueError, match="alternatives must be >= 0"):
        passes.auto_streams(alternatives=-1)


def test_a_kept_alternative_is_the_only_graph_a_later_compile_builds(
    finished_graphs: list[torch.fx.GraphModule], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AIRSTREAM_DECISIONS", "disk")
    model = MoE(4, 256).eval()
    compiled, _ = compile_model(model, _config())
    _run(compiled, model, 4 * 2 * 3)
    (stored,) = list_decisions()
    (path,) = stored.directory.glob("range-*.json")
    entry = json.loads(path.read_text())
    entry["decision"]["chosen"] = BALANCED  # as if the clock had kept it
    path.write_text(json.dumps(entry))

    torch.compiler.reset()
    finished_graphs.clear()
    compiled, backend = compile_model(model, _config())
    _run(compiled, model, 2)
    (graph,) = finished_graphs
    assert {n.meta.get(STREAM_KEY) for n in graph.graph.nodes} == {None, "auto_branch_1"}
    measured = graph_of(backend, "inference").measurement
    assert measured is not None and measured.stored and measured.chosen == BALANCED

    # a decision for a candidate this compile does not propose is measured again
    entry["decision"]["chosen"] = "auto_streams something else"
    path.write_text(json.dumps(entry))
    torch.compiler.reset()
    finished_graphs.clear()
    compiled, backend = compile_model(model, _config())
    _run(compiled, model, 2)
    assert len(finished_graphs) == 1  # the placement: the others compile at their turns
    _run(compiled, model, 4)
    assert len(finished_graphs) == 3


def test_where_the_table_declines_the_shared_experts_are_proposed_for_measuring() -> None:
    from airstream.selftest.models import ARCHS

    arch = ARCHS["qwen2_moe"]
    model = arch.build().eval()
    ids = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    for measure in ("auto", False):
        config = airstream.CompilerConfig()
        # min_gain out of reach: the cost table alone never places anything
        config.post_grad_custom_pre_pass = passes.auto_streams(min_gain=10, costs="nominal")
        config.stream_config.measure_placement = measure
        config.stream_config.measure_calls = 2
        torch.compiler.reset()
        compiled, backend = compile_model(model, config)
        with torch.no_grad():
            for _ in range(4 * 2 * 2):
                assert_same(compiled(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)
        graph = graph_of(backend, "inference")
        decision = graph.graph_module.meta["airstream_auto_streams"]
        labels = {n.meta.get(STREAM_KEY) for n in graph.graph_module.graph.nodes} - {None}
        if measure is False:  # nothing would measure it: the table's word stands
            assert not decision.applied and labels == set() and graph.measurement is None
            continue
        assert decision.applied and decision.pattern.startswith("shared experts, to be measured")
        assert labels == {"auto_shared"}
        shared = [n for n in graph.graph_module.graph.nodes if n.meta.get(STREAM_KEY)]
        paths = [module_paths(n)[-1] for n in shared]
        # the shared expert and its gate, beside the routed experts, which stay on main
        assert all(".mlp" in p and ".experts." not in p for p in paths), paths
        assert any(".shared_expert.down_proj" in p for p in paths)
        measured = graph.measurement
        assert measured is not None and measured.chosen is not None


@pytest.mark.usefixtures("default_mode")
def test_in_the_default_mode_every_candidate_runs_its_own_segments() -> None:
    model = MoE(4, 256).eval()
    compiled, backend = compile_model(model, _config())
    _run(compiled, model, 4 * 2 * 3)
    graph = graph_of(backend, "inference")
    assert graph.mode == "max-autotune" and graph.fallbacks == 0
    measured = graph.measurement
    assert measured is not None and set(measured.seconds) == {ONE_STREAM, PLACED, BALANCED}
    assert measured.chosen is not None
