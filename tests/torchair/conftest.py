"""TorchAir's own tests, ported (see docs/torchair-tests.md for the table).

Each test names the upstream test it ports with ``@upstream("tests/st/<file>.py::<test>")``;
``tools/torchair_port_table.py`` reads those names to build the table. The compat layer is
installed once for this folder, without the process-wide ``device="npu"`` rewrite (the tests
run on CPU tensors, as upstream's ST tests do), so ``import torchair`` resolves to airstream.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import warnings
from collections.abc import Iterator

import pytest

from airstream.compat.torchair import install

install(verbose=False, device_mode=False)


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
