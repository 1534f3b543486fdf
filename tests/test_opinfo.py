"""A fast subset of the OpInfo sweep (the full one: ``airstream selftest opinfo``)."""

from __future__ import annotations

import pytest
from tests.conftest import slow

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


# The default set's sweep: one op per code path the subset exercises (pointwise, a matrix
# multiply, randomness, a multi-output op with a layout crossing segments, a reduction).
CORE = ["add", "mm", "nn.functional.dropout", "native_batch_norm", "sum"]

CONFIGS = (
    "airstream",
    "airstream 3 streams",
    "airstream run_eagerly",
    "airstream max-autotune",
    "airstream max-autotune 3 streams",
)


_SUBSET_SLOW = slow(
    "35 ops x 5 configurations, max-autotune's C++ kernels for each (about 2 min)",
    "tests/test_opinfo.py::test_the_sweep_finds_no_failure_of_ours",
)


# one test per sweep (not a shared fixture): pytest-xdist would compute a fixture on every
# worker that runs one of its tests
@pytest.mark.parametrize(
    "ops", [CORE, pytest.param(SUBSET, marks=_SUBSET_SLOW)], ids=["core", "subset"]
)
def test_the_sweep_finds_no_failure_of_ours(ops: list[str]) -> None:
    sweep = run_sweep(ops=ops, max_samples=2, configs=CONFIGS)
    assert sweep["ours"] == [], sweep["ours"]
    assert sweep["silent_mismatches_ours"] == 0

    # multi-stream equals single-stream, and single-stream matches aot_eager
    table = sweep["table"]
    assert table["airstream"]["samples"] > len(ops)  # 2 samples for most ops
    one, three, serial = (
        table[c]["samples_passed"]
        for c in ("airstream", "airstream 3 streams", "airstream run_eagerly")
    )
    assert one == three == serial, "the syncs are complete: streams change no result"
    assert one >= table["aot_eager"]["samples_passed"]

    # max-autotune matches reduce-overhead, and every sample really went through Inductor
    for config in ("airstream max-autotune", "airstream max-autotune 3 streams"):
        assert table[config]["samples"] == table["airstream"]["samples"]
        assert table[config]["samples_passed"] == table["airstream"]["samples_passed"], config
        assert table[config]["samples_fallback"] == 0, sweep["fallback_ops"]
