"""TorchAir's own tests, ported (see docs/torchair-tests.md for the table).

Each test names the upstream test it ports with ``@upstream("tests/st/<file>.py::<test>")``;
``tools/torchair_port_table.py`` reads those names to build the table. ``import torchair``
resolves to airstream's compat layer; the torch_npu stand-in is installed around each test
(without the ``device="npu"`` rewrite: the tests run on CPU tensors, as upstream's ST tests do).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from collections.abc import Iterator

import pytest

from airstream.compat.torchair.install import alias_torchair, install, uninstall

alias_torchair()  # the test modules import torchair when they are collected


@pytest.fixture(autouse=True)
def _torch_npu_stand_in() -> Iterator[None]:
    """torch_npu, torch.npu and .npu() for each test here, taken back after it (the rest of the
    suite runs in the same process and must not see an NPU)."""
    install(verbose=False, device_mode=False)
    yield
    uninstall()


def upstream(*names: str) -> pytest.MarkDecorator:
    """Mark a test as the port of the named upstream TorchAir test(s)."""
    return pytest.mark.upstream(*names)


@contextlib.contextmanager
def capture_stdout() -> Iterator[io.StringIO]:
    """What is printed to ``sys.stdout`` inside the block."""
    out, saved = io.StringIO(), sys.stdout
    sys.stdout = out
    try:
        yield out
    finally:
        sys.stdout = saved


@contextlib.contextmanager
def capture_warnings() -> Iterator[io.StringIO]:
    """Every warning raised inside the block, one per line, as ``Category: message``."""
    out = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield out
        finally:
            for w in caught:
                out.write(f"{w.category.__name__}: {w.message}\n")


@contextlib.contextmanager
def capture_logger(level: int = logging.DEBUG) -> Iterator[io.StringIO]:
    """What the root logger receives inside the block (TorchAir's logger propagates to it)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)
