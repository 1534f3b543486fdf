"""Real transformers models through airstream (a fast subset of `airstream selftest models`).

Each case builds the architecture from a small config with random weights, compiles it in one
airstream configuration, and compares with eager (logits, gradients, or generated tokens); the
graph counts are compared with aot_eager's for the same calls.
"""

from __future__ import annotations

import pytest
from tests.conftest import slow

from airstream.selftest.models import ARCHS, applies, format_table, run_case, run_suite

_FAST = "tests/test_models.py::test_model_case_matches_eager"
CASES = [
    ("llama", "forced"),  # every third op on a side stream: the planner's syncs on a real graph
    pytest.param(  # a second sequence length: dynamic shapes, no extra recompile
        "llama", "two_lengths", marks=slow("a second compile with dynamic shapes", _FAST)
    ),
    ("qwen2_moe", "shared_expert"),  # the shared expert beside routing
    ("qwen2_moe_alt", "default"),  # the same on a torch.Stream in model code, no pass
    pytest.param(  # its backward: gradients of both streams' ops
        "qwen2_moe_alt", "training", marks=slow("a MoE model's forward and backward", _FAST)
    ),
    pytest.param("qwen2_moe", "auto_streams", marks=slow("another MoE compile", _FAST)),
    pytest.param("deepseek_v3", "shared_expert", marks=slow("another MoE model", _FAST)),
    pytest.param(  # greedy decoding with the KV cache: the same tokens
        "deepseek_v3", "generate", marks=slow("prefill and 4 decode graphs, compared", _FAST)
    ),
    pytest.param(  # Inductor segments, with DynamicCache's constant tensor
        "gpt2", "max-autotune", marks=slow("Inductor's C++ kernels for a whole model", _FAST)
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


@pytest.mark.parametrize(("arch", "config"), CASES)  # ids: llama-forced, ...
def test_model_case_matches_eager(arch: str, config: str) -> None:
    result = run_case(ARCHS[arch], config)
    assert result.status == "pass", format_table([result])
    assert result.extra_recompiles == 0, format_table([result])
    assert result.graphs == result.reference_graphs, "no graph break of airstream's own"
    if config in ("forced", "shared_expert") or ARCHS[arch].alt_stream:
        assert result.side_streams >= 1, "the configuration placed work on a side stream"


@slow("BERT's forward and backward, compiled and with aot_eager", _FAST)
def test_a_difference_torch_makes_without_airstream_is_classified_as_such() -> None:
    """BERT's pooler is not in the loss: eager leaves its gradient None, AOTAutograd (with or
    without airstream) makes zeros. That is torch's, and the table says so."""
    result = run_case(ARCHS["bert"], "training")
    assert result.status == "aot_eager too", format_table([result])
    assert "pooler.dense.weight.grad is a tensor compiled, None in eager" in result.detail


def test_cases_that_do_not_apply_are_reported_as_such() -> None:
    assert not applies(ARCHS["llama"], "shared_expert")
    assert not applies(ARCHS["bert"], "generate")
    (result,) = run_suite(["bert"], ["generate"])
    assert result.status == "n/a" and "bert" not in format_table([result]).splitlines()[2]


def test_unknown_names_are_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"\['lama'\].*architectures: llama, gpt2"):
        run_suite(["lama"])
