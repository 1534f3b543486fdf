"""A fast subset of the OpInfo sweep (the full one: ``airstream selftest opinfo``)."""

from __future__ import annotations

import pytest

from airstream.selftest.opinfo import run_sweep

SUBSET = [
    "add",
    "mul",
    "div",
    "sin",
    "exp",
    "log_softmax",
    "softmax",
    "mm",
    "addmm",
    "bmm",
    "cat",
    "stack",
    "index_select",
    "index_add",
    "gather",
    "scatter",
    "where",
    "sum",
    "mean",
    "amax",
    "cumsum",
    "transpose",
    "permute",
    "reshape",
    "expand",
    "narrow",
    "clamp",
    "nn.functional.gelu",
    "nn.functional.layer_norm",
    "nn.functional.linear",
    "nn.functional.dropout",
    "bernoulli",
    # found by the max-autotune sweep: a convolution's output layout (channels-last) crossing a
    # segment boundary, and multi-output ops whose getitems land in the next segment
    "nn.functional.conv2d",
    "native_batch_norm",
    "nn.functional.max_pool1d",
]


CONFIGS = (
    "airstream",
    "airstream 3 streams",
    "airstream run_eagerly",
    "airstream max-autotune",
    "airstream max-autotune 3 streams",
)


@pytest.fixture(scope="module")
def sweep() -> dict:
    return run_sweep(ops=SUBSET, max_samples=2, configs=CONFIGS)


def test_subset_has_no_failure_of_ours(sweep: dict) -> None:
    assert sweep["ours"] == [], sweep["ours"]
    assert sweep["silent_mismatches_ours"] == 0


def test_multi_stream_equals_single_stream_and_single_matches_aot_eager(sweep: dict) -> None:
    table = sweep["table"]
    assert table["airstream"]["samples"] > 40
    one, three, serial = (
        table[c]["samples_passed"]
        for c in ("airstream", "airstream 3 streams", "airstream run_eagerly")
    )
    assert one == three == serial, "the syncs are complete: streams change no result"
    assert one >= table["aot_eager"]["samples_passed"]


def test_max_autotune_matches_reduce_overhead_on_the_subset(sweep: dict) -> None:
    table = sweep["table"]
    for config in ("airstream max-autotune", "airstream max-autotune 3 streams"):
        assert table[config]["samples"] == table["airstream"]["samples"]
        assert table[config]["samples_passed"] == table["airstream"]["samples_passed"], config
        # every sample of the subset really went through Inductor
        assert table[config]["samples_fallback"] == 0, sweep["fallback_ops"]
