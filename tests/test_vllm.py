"""airstream inside vLLM's CPU build: a tiny Qwen2-MoE served with airstream as the compile
backend gives vLLM's own greedy tokens, with the streams where the passes put them.

Needs the optional extra (README: Serving with vLLM); skipped without vLLM. Each engine runs in
a process of its own (``airstream.bench.vllm.Engine``): vLLM keeps process-wide state.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is not installed (README: Serving with vLLM)")

from airstream.bench.vllm import Engine, save_tiny_moe

pytestmark = pytest.mark.vllm

STEPS = 6
SHAPES = [(1, 16), (5, 16), (32, 16), (3, 100)]  # (prompts, prompt tokens): decode and prefill
ENGINES: dict[str, dict[str, Any]] = {
    "eager": {"mode": 0},  # vLLM without torch.compile
    "inductor": {"mode": 2},  # vLLM's default on CPU
    "shared_expert": {"mode": 2, "backend": "airstream.compat.vllm.shared_expert"},
    "auto_streams": {"mode": 2, "backend": "airstream.compat.vllm.auto_streams"},
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Each engine's greedy tokens at every shape, its placements and its log."""
    folder = tmp_path_factory.mktemp("vllm")
    model = save_tiny_moe(folder / "model", hidden=128, layers=2)
    out: dict[str, Any] = {}
    # the mode users get (max-autotune on CPU), not the one tests/conftest.py pins for speed
    pinned = os.environ.pop("AIRSTREAM_MODE", None)
    try:
        for name, compilation in ENGINES.items():
            log = folder / f"{name}.log"
            engine = Engine(model, compilation, STEPS, warm=1, log=log)
            try:
                tokens = [
                    engine.ask({"batch": b, "length": n, "steps": STEPS, "seed": 7})["tokens"]
                    for b, n in SHAPES
                ]
            finally:
                engine.stop()
            out[name] = {"tokens": tokens, "ready": engine.ready, "log": log.read_text()}
    finally:
        if pinned is not None:
            os.environ["AIRSTREAM_MODE"] = pinned
    yield out


@pytest.mark.parametrize("name", ["inductor", "shared_expert", "auto_streams"])
def test_greedy_tokens_equal_vllms_own(answers: dict[str, Any], name: str) -> None:
    want = answers["eager"]["tokens"]
    assert [len(t) for t in want] == [b for b, _ in SHAPES]
    assert all(len(seq) == 1 + STEPS for shape in want for seq in shape)
    assert answers[name]["tokens"] == want
    assert "Check failed" not in answers[name]["log"]


def _inference_graphs(answers: dict[str, Any], name: str) -> list[dict[str, Any]]:
    graphs = [g for g in answers[name]["ready"]["placements"] if g["kind"] == "inference"]
    assert graphs, answers[name]["ready"]
    return graphs


def test_the_shared_expert_stays_on_main_where_its_linears_must_and_says_why(
    answers: dict[str, Any],
) -> None:
    """Its linears (oneDNN matmuls keeping a primitive made for their first call's thread
    count) stay on main; what is left, the activation and the gate, would pay a side stream's
    handoffs for nothing (0.40-0.76x of one stream when placed), so nothing moves."""
    (graph,) = _inference_graphs(answers, "shared_expert")
    assert not graph["side_streams"], graph["side_streams"]
    log = answers["shared_expert"]["log"]
    assert "stay on the main stream" in log
    assert "_C::onednn_mm: it keeps a oneDNN primitive" in log
    assert "the whole shared expert stays there" in log


def test_auto_streams_keeps_attention_on_main_and_says_what_it_measured(
    answers: dict[str, Any],
) -> None:
    for graph in _inference_graphs(answers, "auto_streams"):
        for ops in graph["side_streams"].values():
            assert not any("attention" in op for op in ops), ops
        assert graph["measured"], graph  # a decision (or its measuring) per size range


def test_auto_streams_decides_every_size_range_at_start_up_and_keeps_linears_on_main(
    answers: dict[str, Any],
) -> None:
    (worker,) = answers["auto_streams"]["ready"]["warm_up"]
    assert worker["sizes"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], worker
    assert worker["decisions"], worker
    for decisions in worker["decisions"].values():
        lines = decisions.splitlines()
        # every range vLLM schedules (1 to max_num_batched_tokens) decided before serving
        assert len(lines) >= len(worker["sizes"]), decisions
        assert all(": kept " in line for line in lines), decisions
    for graph in _inference_graphs(answers, "auto_streams"):
        for ops in graph["side_streams"].values():
            assert not any("onednn" in op for op in ops), ops
