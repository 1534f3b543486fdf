"""Stream-program fuzzing with hypothesis: CPU runtime == serial executor, no hangs; broken
programs raise StreamError."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import slow

from airstream.selftest import fuzz

# example counts from the profile tests/conftest.py loads: 5 by default, 60 with --runslow
_settings = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)


@_settings
@given(st.randoms(use_true_random=False))
def test_random_stream_programs_match_serial(rng: random.Random) -> None:
    program = fuzz.draw_program(rng, max_steps=20)
    fuzz.check_program(program, runs=3, timeout=30.0)


@_settings
@given(st.randoms(use_true_random=False))
def test_broken_stream_programs_raise_stream_error(rng: random.Random) -> None:
    program = fuzz.draw_program(rng)
    fuzz.check_invalid(program, rng)


def test_fuzzer_covers_every_feature() -> None:
    rng = random.Random(0)
    kinds: set[str] = set()
    for _ in range(50):
        kinds |= {s.kind for s in fuzz.draw_program(rng).steps}
    assert kinds == {"op", "rand", "record", "wait", "wait_tensor", "mutate"}


def test_a_hang_fails_instead_of_blocking() -> None:
    import threading

    import pytest

    never = threading.Event()
    with pytest.raises(fuzz.FuzzHang, match="did not finish within 0.2 s"):
        fuzz._call_with_timeout(never.wait, 0.2, "a blocked call")
    never.set()


@slow(
    "each program compiles C++ kernels (40 programs)",
    "tests/test_fuzz.py::test_max_autotune_fuzzing_compiles_segments",
)
@settings(max_examples=min(40, settings.default.max_examples), deadline=None, derandomize=True)
@given(st.randoms(use_true_random=False))
def test_random_stream_programs_under_max_autotune_match_the_aten_path(rng: random.Random) -> None:
    program = fuzz.draw_program(rng, max_steps=16)
    fuzz.check_program_max_autotune(program, runs=2, timeout=60.0, min_ops=1)


@pytest.mark.torch_api
def test_max_autotune_fuzzing_compiles_segments() -> None:
    report = fuzz.run_fuzz(4, seed=3, runs=1, mode="max-autotune")
    assert report["valid"] == 4 and report["segments"] > 0
