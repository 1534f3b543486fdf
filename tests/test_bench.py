"""``airstream bench overhead``: the report's shape (figures are printed, never asserted)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from tests.conftest import slow

from airstream.bench.overhead import format_overhead, run_overhead


def test_overhead_report_structure() -> None:
    report = run_overhead(ops=20, rounds=2, calls=3)
    assert report["ops"] == 20
    runners = set(report["results"])
    assert runners == {
        "fx.GraphModule",
        "fx.Interpreter",
        "airstream executor",
        "airstream torch.compile",
        "aot_eager torch.compile",
        "airstream cache_compile",
    }
    assert 0 < report["us_profiler_check_per_call"] < 100
    assert report["results"]["fx.GraphModule"]["ratio_vs_graphmodule"] == pytest.approx(1.0)
    assert all(r["us_per_call"] > 0 for r in report["results"].values())
    assert "vs GraphModule" in format_overhead(report)


def test_moe_report_structure() -> None:
    from airstream.bench.moe import format_moe, run_moe

    report = run_moe(experts=2, tokens=2, hidden=16, rounds=1, calls=1, inductor=False)
    assert set(report["ms"]) == {
        f"eager ({torch.get_num_threads()} threads)",
        "eager (1 thread)",
        "airstream 1 stream",
        "airstream 2 streams",
        "hand-written threads",
    }
    assert "moe_1" in report["plan"]
    assert report["speedup_2_streams_vs_1_stream"] > 0
    assert "ceiling on this machine" in format_moe(report)


@pytest.mark.parametrize("name", ["moe", "moe-shared", "branches", "mlp"])
def test_suite_report_structure(name: str) -> None:
    from airstream.bench.suite import format_suite, run_suite

    report = run_suite(name, tokens=2, hidden=16, rounds=1, calls=1, inductor=False)
    assert {"eager", "airstream 1 stream"} <= set(report["ms"])
    assert any(r.startswith("airstream auto_streams") for r in report["ms"])
    assert report["speedup_vs_1_stream"]["airstream 1 stream"] == pytest.approx(1.0)
    assert name in format_suite(report)


def test_pass_timing_structure() -> None:
    from airstream.bench.suite import pass_timing

    report = pass_timing(chains=4, length=10)
    assert report["nodes"] > 40 and set(report["seconds"]) == {
        "auto_streams flops",
        "moe_experts",
        "shared_expert_overlap",
    }


def test_batched_experts_report_structure() -> None:
    from airstream.bench.batched import run_batched

    report = run_batched(experts=2, tokens=2, hidden=16, rounds=1, calls=1)
    assert len(report["ms"]) == 3 and all(v > 0 for v in report["ms"].values())
    assert "split per expert, 2 streams" in report["ms"]


@slow(
    "Inductor and max-autotune runners compile C++ kernels",
    "tests/test_bench.py::test_modes_report_structure_without_inductor",
)
def test_modes_report_structure() -> None:
    from airstream.bench.modes import format_modes, run_modes

    report = run_modes(
        "branches-pointwise", tokens=2, hidden=16, rounds=1, calls=1, compile_times=False
    )
    assert set(report["ms"]) == {
        "eager",
        "inductor",
        "airstream reduce-overhead 1 stream",
        "airstream reduce-overhead 2 streams",
        "airstream max-autotune 1 stream",
        "airstream max-autotune 2 streams",
        "hand-written threads (Inductor parts)",
    }
    assert report["segments"]["airstream reduce-overhead 2 streams"] == 0
    # one segment per branch (and the join) on 2 streams: every branch's chain is fused
    assert report["segments"]["airstream max-autotune 2 streams"] >= 4
    assert report["streams_used"]["airstream max-autotune 2 streams"] == 2
    assert "max-autotune" in format_modes(report)


@slow(
    "Inductor compiles the model, its chains and airstream's segments: 7 C++ builds",
    "tests/test_kernel_gil.py::test_every_kernel_of_a_two_stream_graph_lets_go_of_the_gil",
)
def test_kernel_split_report_structure() -> None:
    from airstream.bench.kernel_split import format_kernel_split, run_kernel_split

    report = run_kernel_split(tokens=4, hidden=16, rounds=1, calls=1)  # results checked inside
    threads = torch.get_num_threads()
    assert list(report["ms"]) == [
        "inductor, 1 thread",
        "airstream 1 stream",
        "airstream 2 streams",
        "hand-written threads (Inductor parts)",
        "hand-written threads (eager parts)",
        *([f"inductor, {threads} threads"] if threads > 1 else []),
    ]
    assert report["kernel_gil"] == "release"
    assert 1.0 <= report["streams_busy_at_once"] <= 2.0
    assert "streams busy at once" in format_kernel_split(report)


def test_modes_report_structure_without_inductor() -> None:
    from airstream.bench.modes import format_modes, run_modes

    report = run_modes(
        "branches-pointwise",
        modes=("reduce-overhead",),
        tokens=2,
        hidden=16,
        rounds=1,
        calls=1,
        inductor=False,
        compile_times=False,
    )
    assert set(report["ms"]) == {
        "eager",
        "airstream reduce-overhead 1 stream",
        "airstream reduce-overhead 2 streams",
    }
    assert report["streams_used"]["airstream reduce-overhead 2 streams"] == 2
    assert "reduce-overhead" in format_modes(report)


@pytest.mark.distributed
@slow(
    "2 gloo ranks, 4 runners compiled in each",
    "tests/test_distributed.py::test_collectives_on_two_streams_match_a_single_process",
)
def test_tp_report_structure() -> None:
    from airstream.bench.tp import format_tp, run_tp

    report = run_tp(nproc=2, layers=1, tokens=4, hidden=16, rounds=1, calls=1)
    assert set(report["ms"]) == {
        "eager",
        "airstream 1 stream",
        "airstream overlap_communication",
        "airstream overlap_communication(producers=False)",
    }
    assert set(report["ms_by_rank"]) == {0, 1}
    assert report["streams"]["airstream overlap_communication"] == ["None", "comm"]
    assert report["profiles_rank0"]["airstream 1 stream"]["wait_tensor_us"] > 0
    assert "vs 1 stream" in format_tp(report)


# A Qwen2-MoE decode model small enough for a test: (config class, model class, config, the
# shared expert's module name pattern), as bench decode's DECODE_MODELS holds it.
_TINY_QWEN2_MOE = (
    "Qwen2MoeConfig",
    "Qwen2MoeForCausalLM",
    {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        "num_experts_per_tok": 2,
    },
    r"shared_expert\b",
)


def test_bench_suite_models_times_auto_streams_against_one_stream() -> None:
    from airstream.bench.suite_models import format_suite_models, run_suite_models

    report = run_suite_models(("qwen2_moe",), rounds=1, calls=1)
    figures = report["models"]["qwen2_moe"]
    assert set(figures["ms"]) == {"one stream", "auto_streams", "auto_streams predicted"}
    assert figures["vs_one_stream"]["one stream"] == 1.0
    # auto_streams proposes Qwen2-MoE's shared experts for the measuring, which decided
    (kept,) = figures["kept"]
    assert kept in ("one stream", "streams as placed") or kept.startswith("auto_streams "), kept
    text = format_suite_models(report)
    assert "qwen2_moe" in text and "lowest auto_streams / one stream" in text


def test_bench_threads_sets_each_measured_decision_beside_the_steady_state() -> None:
    from airstream.bench.threads import format_threads, run_threads, thread_counts

    report = run_threads(experts=2, tokens=4, hidden=64, rounds=1, calls=1, trials=1)
    counts = thread_counts()
    assert report["thread_counts"] == list(counts) and counts[0] == 1
    (decision,) = report["measured"]
    assert decision.startswith("kept "), decision  # every candidate timed, one kept
    for count in counts[1:]:  # each other count was a candidate of the measuring
        assert f"streams as placed, {count} threads per stream" in decision
    assert set(report["ms"]) == {"one stream"} | {
        f"2 streams, {c} thread{'s' * (c > 1)} each" for c in counts
    }
    assert report["vs_one_stream"]["one stream"] == 1.0
    assert "steady state, measuring off" in format_threads(report)


@slow(
    "a transformers model's training step compiled by 4 runners, forward and backward each",
    "tests/test_measured.py::test_a_training_steps_forward_and_backward_are_each_measured",
)
def test_bench_train_checks_every_runner_and_measures_both_graphs(
    monkeypatch: pytest.MonkeyPatch, default_mode: None
) -> None:
    """In the mode users get (Inductor segments on CPU): a real transformers model's training
    step, each graph measured, loss and gradients against eager."""
    from airstream.bench import train

    monkeypatch.setattr(train, "DECODE_MODELS", {"qwen2-moe": _TINY_QWEN2_MOE})
    report = train.run_train(("qwen2-moe",), batch=2, length=4, rounds=1, calls=1, inductor=False)
    runners = report["models"]["qwen2-moe"]
    assert set(runners) == {"eager", "airstream", "auto_streams", "auto_streams predicted"}
    assert all(figures["step_ms"] > 0 for figures in runners.values())
    # the measured runner decided for its forward and its backward before the timing
    measured = runners["auto_streams"]["measured"]
    assert measured == "nothing to measure" or measured.count("kept ") >= 1, measured
    text = train.format_train(report)
    assert "of one stream" in text and "loss and backward per step" in text


@slow(
    "a transformers model compiled by 6 runners, Inductor's C++ kernels among them",
    "tests/test_bench.py::test_serving_loop_report_structure",
)
def test_bench_decode_checks_every_runner_and_reports_tokens_per_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from airstream.bench import decode

    models = {"qwen2-moe": _TINY_QWEN2_MOE}
    monkeypatch.setattr(decode, "DECODE_MODELS", models)
    report = decode.run_decode(("qwen2-moe",), batch=2, prompt=4, rounds=1, calls=1)
    runners = report["models"]["qwen2-moe"]
    assert set(runners) == {
        "eager",
        "inductor",
        "airstream",
        "auto_streams",
        "auto_streams predicted",  # measure_placement off: the cost table's decision alone
        "shared_expert",
        "airstream max-autotune",  # the mode the default is not (the suite pins reduce-overhead)
        "alt_stream",
    }
    for figures in runners.values():
        assert figures["step_ms"] > 0 and figures["tokens_per_s"] == pytest.approx(
            2 / (figures["step_ms"] / 1e3)
        )
    text = decode.format_decode(report)
    assert "shared_expert" in text and "tok/s" in text and "compile" in text
    assert "alt_stream (torch.Stream in the model's code, no pass)" in text


def test_bench_decode_alt_stream_runner_runs_the_models_own_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The alt_stream runner: the same weights, the shared expert under a torch.Stream in the
    model's code; its decode step gives eager's logits with a side stream in its graph."""
    from airstream.bench import decode

    monkeypatch.setattr(decode, "DECODE_MODELS", {"qwen2-moe": _TINY_QWEN2_MOE})
    model, _ = decode.build_model("qwen2-moe")
    backend = decode._plain_backend()
    alt_step, _ = decode.decode_step(decode._alt_stream_model("qwen2-moe", "cpu"), backend, 2, 4, 8)
    eager_step, _ = decode.decode_step(model, None, 2, 4, 8)
    torch.testing.assert_close(alt_step(), eager_step(), rtol=1e-4, atol=1e-4)
    sides = {label for g in backend.graphs for label in g.streams.side_streams}
    assert sides == {"alt_stream"}


def test_serving_loop_report_structure(monkeypatch: pytest.MonkeyPatch) -> None:
    from airstream.bench import decode, serving

    models = {"qwen2-moe": _TINY_QWEN2_MOE}
    monkeypatch.setattr(decode, "DECODE_MODELS", models)
    report = serving.run_serving(serving.SERVING_MODELS, batch=2, hidden=16, rounds=1, calls=1)
    assert set(report["models"]) == {"moe", "heads", "decode"}
    for conditions in report["models"].values():
        assert set(conditions) == {"alone", "loop"}
        for runners in conditions.values():
            assert set(runners) == {
                "eager",
                "1 stream",
                "streams",
                "streams, workers",
                "streams, no release",
            }
            for figures in runners.values():
                assert 0 < figures["call_ms"] <= figures["iteration_ms"] and figures["work_ms"] >= 0
    text = serving.format_serving(report)
    assert "streams, no release" in text and "iteration" in text


def test_bench_refuses_a_device_it_cannot_use(capsys: pytest.CaptureFixture[str]) -> None:
    from airstream.cli import main

    assert main(["bench", "overhead", "--device", "cuda"]) == 2
    assert "--device cuda is not supported" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["bench", "moe", "--device", "cuda"]) == 2
        assert "no CUDA GPU is visible" in capsys.readouterr().err
    assert main(["bench", "moe", "--device", "tpu"]) == 2
    assert "choose cpu or cuda[:N]" in capsys.readouterr().err


def test_each_benchmark_runs_with_its_own_defaults_and_the_help_says_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One table says what each benchmark defaults to: what it is called with and what the
    help prints come from it (the help said tokens 8 where memory used 4096)."""
    from airstream.cli import benches, main

    seen: dict[str, dict[str, int]] = {}

    def recording(name: str) -> Any:
        def run(args: Any) -> tuple[dict[str, Any], str]:
            seen[name] = {o: getattr(args, o) for o in benches.OPTIONS}
            return {}, "ran"

        return run

    table = {n: dataclasses.replace(b, run=recording(n)) for n, b in benches.BENCHES.items()}
    monkeypatch.setattr(benches, "BENCHES", table)
    monkeypatch.setattr(benches, "_modes", recording("modes"))
    assert main(["bench", "memory"]) == 0
    assert seen["memory"] == {"rounds": 15, "calls": 3, "tokens": 4096, "hidden": 1024, "layers": 8}
    assert main(["bench", "decode", "--tokens", "2"]) == 0
    assert seen["decode"]["tokens"] == 2 and seen["decode"]["calls"] == 3
    assert main(["bench", "moe", "--mode", "both"]) == 0
    assert seen["modes"]["calls"] == 20
    assert main(["bench", "mlp", "--mode", "both"]) == 2
    assert "--mode applies to moe, branches-pointwise" in capsys.readouterr().err
    assert main(["bench", "decode", "--alone", "--mode", "max-autotune"]) == 0
    assert seen["decode"]["rounds"] == 5 and seen["decode"]["calls"] == 6  # process per round
    assert main(["bench", "moe", "--alone"]) == 2
    assert "--alone applies to decode" in capsys.readouterr().err
    assert benches.default_help("tokens") == (
        "default 8; kernel-split 256, tp 64, memory 4096, decode 4, train 2"
    )


def test_the_never_slower_line_measures_each_config_against_the_best_backend() -> None:
    from airstream.bench.verdict import never_slower, never_slower_line

    times = {"eager": 10.0, "inductor": 8.0, "one": 8.2, "two": 9.0, "hand": 7.0}
    verdict = never_slower(times, ["one", "two"], ["eager", "inductor"], ["eager", "hand"])
    assert verdict["baseline"] == "inductor" and verdict["ceiling"] == "hand"
    one, two = verdict["configs"]["one"], verdict["configs"]["two"]
    assert one["vs_best"] == pytest.approx(8.0 / 8.2) and one["met"]  # 0.976 >= 0.97
    assert two["vs_best"] == pytest.approx(8.0 / 9.0) and not two["met"]
    assert two["vs_ceiling"] == pytest.approx(7.0 / 9.0)
    line = never_slower_line(verdict, "interleaved")
    assert "here inductor; ceiling: hand; interleaved" in line
    assert "one 0.98x (0.85x of the ceiling), two 0.89x (0.78x of the ceiling) SLOWER" in line


def test_microbatch_report_with_modelled_communication() -> None:
    from airstream.bench.microbatch import format_microbatch, run_microbatch

    report = run_microbatch(
        nproc=2,
        models=("tp",),
        sizes=(8, 16),
        layers=1,
        hidden=16,
        rounds=1,
        calls=1,
        comm="modelled",
    )
    rows = report["models"]["tp"]["sizes"]
    assert set(rows) == {"8", "16"}
    for row in rows.values():
        assert max(row["max_rel_error"].values()) < 1e-5, row["max_rel_error"]
        comm = row["modelled_comm_ms"]
        assert comm["pass"] > comm["unsplit"] > 0  # two half-size collectives: alpha twice
        assert comm["unsplit (comm free)"] == 0
        assert set(row["hidden_share"]) == {"hand unsplit", "hand split", "unsplit", "pass"}
        assert row["decision"].startswith("s") and "kept" in row["decision"]
    text = format_microbatch(report)
    assert "modelling 2 ranks" in text and "hidden" in text


@pytest.mark.distributed
@slow(
    "2 gloo ranks, 7 runners each, both models",
    "tests/test_bench.py::test_microbatch_report_with_modelled_communication",
)
def test_microbatch_report_on_gloo_ranks() -> None:
    from airstream.bench.microbatch import format_microbatch, run_microbatch

    report = run_microbatch(nproc=2, sizes=(8,), layers=1, hidden=16, rounds=1, calls=1)
    for model in ("tp", "moe"):
        row = report["models"][model]["sizes"]["8"]
        assert max(row["max_rel_error"].values()) < 1e-5, row["max_rel_error"]
        assert row["modelled_comm_ms"] is None and "hidden_share" not in row
    assert "2 gloo ranks" in format_microbatch(report)


def test_decode_alone_runs_each_runner_in_its_own_process_in_a_rotating_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``bench decode --alone``: one process per runner and round, the order rotating; the
    report's ratios are per round (the processes of a round ran side by side in time)."""
    from airstream.bench import decode_alone

    order: list[str] = []

    def one(model: str, runner: str, batch: int, steps: int) -> dict[str, Any]:
        order.append(runner)
        slower = 1.25 if runner.startswith("auto_streams") else 1.0
        return {"step_ms": 100.0 * slower, "compile_s": 1.0, "measured": "kept one stream"}

    monkeypatch.setattr(decode_alone, "_one", one)
    report = decode_alone.run_alone(["qwen2-moe"], ["max-autotune"], rounds=3, steps=4, batch=4)
    runners = ["inductor", "airstream max-autotune", "auto_streams max-autotune"]
    assert order == runners + runners[1:] + runners[:1] + runners[2:] + runners[:2]
    text = decode_alone.format_alone(report)
    assert "auto_streams / one stream, max-autotune: 0.800x (rounds 0.80, 0.80, 0.80)" in text
    assert "kept: kept one stream" in text
