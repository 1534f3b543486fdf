"""Real transformers models through airstream (a fast subset of `airstream selftest models`).

Each case builds the architecture from a small config with random weights, compiles it in one
airstream configuration, and compares with eager (logits, gradients, or generated tokens); the
graph counts are compared with aot_eager's for the same calls.
"""

from __future__ import annotations

import pytest
from tests.conftest import slow

from airstream.selftest.models import (
    ARCHS,
    CaseResult,
    applies,
    format_table,
    parse_config,
    run_case,
    run_suite,
)

_FAST = "tests/test_models.py::test_model_case_matches_eager"
_DEFAULT_FAST = "tests/test_models.py::test_model_case_matches_eager_in_the_default_mode"
CASES = [
    ("llama", "forced"),  # every third op on a side stream: the planner's syncs on a real graph
    pytest.param(  # a second sequence length: dynamic shapes, no extra recompile
        "llama", "two_lengths", marks=slow("a second compile with dynamic shapes", _FAST)
    ),
    ("qwen2_moe", "shared_expert"),  # the shared expert beside routing
    ("qwen2_moe_alt", "default"),  # the same on a torch.Stream in model code, no pass
    pytest.param(  # a pass's placement beside the model's own stream ops, which it leaves
        "qwen2_moe_alt", "forced", marks=slow("another MoE compile", _FAST)
    ),
    pytest.param(  # its backward: gradients of both streams' ops
        "qwen2_moe_alt", "training", marks=slow("a MoE model's forward and backward", _FAST)
    ),
    pytest.param("qwen2_moe", "auto_streams", marks=slow("another MoE compile", _FAST)),
    pytest.param("deepseek_v3", "shared_expert", marks=slow("another MoE model", _FAST)),
    pytest.param(  # greedy decoding with the KV cache: the same tokens
        "deepseek_v3", "generate", marks=slow("prefill and 4 decode graphs, compared", _FAST)
    ),
    pytest.param(
        "llama",
        "training",
        marks=slow(
            "a model's forward and backward",
            "tests/test_training.py::test_gradients_equal_eager_and_markers_stay_in_forward",
        ),
    ),
]


def _check(result: CaseResult, config: str, arch: str) -> None:
    assert result.status == "pass", format_table([result])
    assert result.extra_recompiles == 0, format_table([result])
    assert result.graphs == result.reference_graphs, "no graph break of airstream's own"
    placement = parse_config(config)[1]
    if placement in ("forced", "shared_expert", "auto_forced") or ARCHS[arch].alt_stream:
        assert result.side_streams >= 1, "the configuration placed work on a side stream"


@pytest.mark.parametrize(("arch", "config"), CASES)  # ids: llama-forced, ...
def test_model_case_matches_eager(arch: str, config: str) -> None:
    result = run_case(ARCHS[arch], config)  # tests/conftest.py: reduce-overhead
    assert result.mode == "reduce-overhead"
    _check(result, config, arch)


# The default mode (Inductor segments on CPU), as users compile: a case per model family and
# per cause the default mode's stream programs had (tests/test_segment_boundaries.py has each at
# its smallest): a dense decoder with streams forced (GQA attention, the KV cache's cat: a
# segment's output layout), an MoE decoder, an encoder, a seq2seq model, training (views returned
# by a segment). A second length (a size symbol no input gave) is in the matrix; at its smallest
# in test_segment_boundaries.py.
DEFAULT_CASES = [
    ("llama", "auto_forced"),
    ("qwen3_moe", "auto_forced"),
    ("bert", "auto_forced"),
    ("t5", "auto_forced"),
    pytest.param(  # the representative: a forward and backward in Inductor segments
        "mistral",
        "training/auto_forced",
        marks=slow(
            "a real model's training in Inductor segments: 68 segments, 49 s with Inductor's "
            "cache empty",
            "tests/test_training.py::test_gradients_equal_eager_in_the_default_mode",
        ),
    ),
]
_IN_THE_DEFAULT_SET = {
    ("default", tuple(case.values) if hasattr(case, "values") else case) for case in DEFAULT_CASES
}
# --runslow: the matrix. Every architecture with streams forced in both modes and with
# auto_streams deciding (nominal costs) in the default mode; the other runs (training, a second
# length, generate) on one architecture per kind of model code: a dense decoder, GPT-2's
# absolute positions and Conv1D, an MoE with a shared expert, a seq2seq model, a state-space
# model (each the default mode, training in both). `airstream selftest models` runs the whole
# cross product (docs/testing.md has its counts); the matrix is what fits CI's time.
_RUNS = ("training/auto_forced", "two_lengths/auto_forced", "generate/auto_forced")
_EVERY_RUN = ("llama", "gpt2", "qwen2_moe", "t5", "mamba")


def _matrix_configs(arch: str, mode: str) -> tuple[str, ...]:
    runs = _RUNS if arch in _EVERY_RUN else ()
    if mode == "default":
        return ("auto_forced", *runs, "auto_streams")
    return ("auto_forced", *runs[:1])  # reduce-overhead: inference, and training


MATRIX = [
    pytest.param(
        arch, config, mode, marks=slow("the model matrix: a compile per case", _DEFAULT_FAST)
    )
    for arch in ARCHS
    for mode in ("default", "reduce-overhead")
    for config in _matrix_configs(arch, mode)
    if applies(ARCHS[arch], config) and (mode, (arch, config)) not in _IN_THE_DEFAULT_SET
]


# On every torch minor (CI's -m torch_api): the dense decoder, the case most of torch's compile
# stack reaches (Dynamo on transformers' code, AOTAutograd, Inductor segments on two streams).
_ON_EVERY_MINOR = ("llama", "auto_forced")


@pytest.mark.parametrize(
    ("arch", "config"),
    [
        case
        if hasattr(case, "values")  # marked already
        else pytest.param(*case, marks=[pytest.mark.torch_api] if case == _ON_EVERY_MINOR else [])
        for case in DEFAULT_CASES
    ],
)
def test_model_case_matches_eager_in_the_default_mode(
    arch: str, config: str, default_mode: None
) -> None:
    result = run_case(ARCHS[arch], config)
    assert result.mode == "max-autotune", "mode='default' on CPU: Inductor segments"
    _check(result, config, arch)
    assert result.fallbacks == 0, format_table([result])


@pytest.mark.parametrize(("arch", "config", "mode"), MATRIX)
def test_the_model_matrix_matches_eager(
    arch: str, config: str, mode: str, default_mode: None
) -> None:
    result = run_case(ARCHS[arch], config, mode)
    _check(result, config, arch)
    if mode == "default":
        assert result.fallbacks == 0, format_table([result])


@pytest.mark.parametrize(
    ("airstream_ok", "aot_eager_ok", "status"),
    [
        (False, False, "aot_eager too"),
        (False, True, "FAIL"),
        (True, False, "pass"),
    ],
)
def test_a_case_is_classified_by_what_aot_eager_does(
    monkeypatch: pytest.MonkeyPatch, airstream_ok: bool, aot_eager_ok: bool, status: str
) -> None:
    """A case that differs from eager is rerun under aot_eager: a difference torch makes without
    airstream is classified as torch's, one only airstream makes as a failure."""
    from airstream.selftest import models
    from airstream.torch_internals import aot_eager

    def run(arch: object, run: str, backend: object, streams: bool = True) -> object:
        ok = aot_eager_ok if backend is aot_eager else airstream_ok
        return models._Outcome(ok, 0.0 if ok else 0.5, 1, 0, "" if ok else "a gradient differs")

    monkeypatch.setattr(models, "_run", run)
    result = run_case(ARCHS["llama"], "training")
    assert result.status == status, format_table([result])
    assert result.detail == ("" if airstream_ok else "a gradient differs")


def test_cases_that_do_not_apply_are_reported_as_such() -> None:
    assert not applies(ARCHS["llama"], "shared_expert")
    assert not applies(ARCHS["bert"], "generate")
    (result,) = run_suite(["bert"], ["generate"])
    assert result.status == "n/a" and "bert" not in format_table([result]).splitlines()[2]


def test_unknown_names_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"\['lama'\].*architectures: llama, mistral"):
        run_suite(["lama"])
    with pytest.raises(ValueError, match=r"\['training/fast'\].*runs two_lengths, training"):
        run_suite(["llama"], ["training/fast"])
    with pytest.raises(ValueError, match=r"unknown mode 'fast'; modes: default, reduce-overhead"):
        run_suite(["llama"], ["default"], mode="fast")


def test_configuration_names_are_a_run_and_a_placement() -> None:
    assert parse_config("default") == ("inference", "none")
    assert parse_config("auto_forced") == ("inference", "auto_forced")
    assert parse_config("training") == ("training", "none")
    assert parse_config("generate/auto_forced") == ("generate", "auto_forced")
    with pytest.raises(ValueError):
        parse_config("inference/auto_forced")  # inference is named by its placement alone
