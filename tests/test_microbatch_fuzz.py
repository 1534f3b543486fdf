"""microbatch_overlap's differential fuzzer (``airstream selftest microbatch``): random graphs
with collectives through the pass, forced, against eager PyTorch. Every graph is split with equal
results (and gradients) or refused; the fuzzer itself tells a wrong split from a right one."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import slow

from airstream.passes.auto import token_dims, token_rules
from airstream.selftest.microbatch_draw import draw_program
from airstream.selftest.microbatch_fuzz import check_program, run_microbatch_fuzz
from airstream.selftest.microbatch_programs import MicrobatchProgram, Step, TensorSpec
from airstream.selftest.microbatch_report import format_report

_FAST = "tests/test_microbatch_fuzz.py::test_random_graphs_split_exactly_or_are_refused"
_EXACT = {"split", "refused", "left_alone"}

# example counts from the profile tests/conftest.py loads: 5 by default, 60 with --runslow
_settings = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@_settings
@given(st.randoms(use_true_random=False))
def test_random_graphs_split_exactly_or_are_refused(one_rank: None, rng: random.Random) -> None:
    program = draw_program(rng)
    outcome = check_program(program)
    assert outcome.kind in _EXACT, f"{outcome}\n{program}"


def _program(lines: list[str], dynamic: bool = False) -> MicrobatchProgram:
    x = TensorSpec("x", ((1, 0), (0, 8)))
    steps = tuple(Step((line,), line.split(" =")[0], (), "") for line in lines)
    tokens = (8, 5, 3) if dynamic else (6,)
    return MicrobatchProgram((x,), (), steps, (steps[-1].defines,), tokens, dynamic, False)


def test_the_fuzzer_tells_a_wrong_split(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule made wrong on purpose (a softmax over the tokens claimed rows) splits a graph the
    fuzzer then reports as a mismatch; with the rule right, the same graph is refused."""
    over_tokens = _program(
        ["v1 = torch.softmax(x, 0)", "v2 = funcol.all_reduce(v1, 'sum', dist.group.WORLD)"]
    )
    assert check_program(over_tokens).kind == "refused"
    monkeypatch.setitem(token_dims._RULES, torch.ops.aten._softmax.default, token_rules.unary)
    outcome = check_program(over_tokens)
    assert outcome.kind == "mismatch" and outcome.error > 1e-3, outcome


def test_a_seeded_run_reports_its_figures(one_rank: None) -> None:
    report = run_microbatch_fuzz(8, seed=11)
    assert report["tried"] == 8 and report["mismatched_count"] == report["crashed_count"] == 0
    counted = report["split"] + sum(report["refused"].values()) + report["left_alone"]
    assert counted == 8
    assert report["split_of_splittable"] <= report["splittable"] <= 8
    text = format_report(report)
    assert text.startswith("microbatch fuzz: 8 graphs (seed 11, reduce-overhead, 1 rank)")
    assert "0 mismatched, 0 crashed" in text


@pytest.mark.distributed
@slow("two gloo ranks compiling 12 graphs each", _FAST)
def test_random_graphs_on_two_ranks() -> None:
    report = run_microbatch_fuzz(12, seed=5, ranks=2)
    assert report["mismatched_count"] == report["crashed_count"] == 0, format_report(report)
    assert report["split"] > 0


@slow("each graph compiles Inductor's C++ segments (about 5 s each)", _FAST)
def test_random_graphs_in_the_default_mode(one_rank: None) -> None:
    report = run_microbatch_fuzz(10, seed=9, mode="max-autotune")
    assert report["mismatched_count"] == report["crashed_count"] == 0, format_report(report)


def test_a_graph_first_compiled_at_two_tokens_in_the_default_mode(one_rank: None) -> None:
    """Found by the default-mode fuzzer (seed 6, program 15): compiled at 2 tokens, its
    segments were built for micro-batches of 1 token and failed at 5 (``expected size 2==1``)."""
    rng = random.Random(6)
    program = [draw_program(rng) for _ in range(16)][15]
    assert "x.select(1, 11)" in program.source()  # the program the fuzzer found
    outcome = check_program(program, "max-autotune", tokens=(2, 5), seed=(6 * 1_000_003 + 15) * 8)
    assert outcome.kind == "refused" and "an example of 2 token(s)" in outcome.detail, outcome
