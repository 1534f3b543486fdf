"""A third-party custom op for tests: records where it ran and can meet a barrier."""

from __future__ import annotations

import threading

import torch

import airstream

# Per-test state, reset by the tests that use it (the op is only ever called from tests).
SEEN: list[tuple[str, str, int]] = []
BARRIERS: dict[str, threading.Barrier] = {}


# The tests' ops keep no state another op uses: they may run at once on different streams.
airstream.declare_shared_state("airstream_test", None)


@torch.library.custom_op("airstream_test::probe", mutates_args=())
def probe(x: torch.Tensor, tag: str) -> torch.Tensor:
    """Return a copy of ``x``; note (tag, thread name, intra-op threads); meet a barrier if set."""
    SEEN.append((tag, threading.current_thread().name, torch.get_num_threads()))
    barrier = BARRIERS.get(tag)
    if barrier is not None:
        barrier.wait()
    return x.clone()


@probe.register_fake
def _(x: torch.Tensor, tag: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("airstream_test::fail_if_negative", mutates_args=())
def fail_if_negative(x: torch.Tensor) -> torch.Tensor:
    """Raise ValueError when ``x`` has a negative element; else return a copy."""
    if bool((x < 0).any()):
        raise ValueError("negative input")
    return x.clone()


@fail_if_negative.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("airstream_test::sleep_then_copy", mutates_args=())
def sleep_then_copy(x: torch.Tensor, seconds: float) -> torch.Tensor:
    """Sleep (releasing the GIL), then return a copy of ``x``."""
    import time

    time.sleep(seconds)
    return x.clone()


@sleep_then_copy.register_fake
def _(x: torch.Tensor, seconds: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("airstream_test::interrupt_if_negative", mutates_args=())
def interrupt_if_negative(x: torch.Tensor) -> torch.Tensor:
    """Raise KeyboardInterrupt when ``x`` has a negative element; else return a copy."""
    if bool((x < 0).any()):
        raise KeyboardInterrupt
    return x.clone()


@interrupt_if_negative.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)
