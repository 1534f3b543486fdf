"""The traceback of an airstream compile error, as a user reads it.

Dynamo prints the error of a backend with its traceback, and without its causes. A user reads
their own code there: the pass that raised and the line in it. :func:`readable` keeps those
frames, and the one frame where airstream raised (the line a bug report needs), and drops torch's
and airstream's other frames. ``TORCHDYNAMO_VERBOSE=1`` keeps every frame, the causes' included.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType

import torch

from airstream.errors import AirstreamError
from airstream.machine.environment import TORCHDYNAMO_VERBOSE

__all__ = ["readable"]

# Frames in these directories are dropped from the trimmed traceback: torch and airstream.
_INTERNAL_DIRS = tuple(
    str(Path(module_file).parent) + os.sep
    for module_file in (torch.__file__, str(Path(__file__).parent.parent / "__init__.py"))
)


def _raised_through(exc: BaseException) -> list[TracebackType]:
    """The traceback entries of ``exc`` and its ``__cause__`` chain as one stack, outermost
    first: each cause continues below the frame that raised its consequence."""
    entries: list[TracebackType] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        own: list[TracebackType] = []
        tb = current.__traceback__
        while tb is not None:
            own.append(tb)
            tb = tb.tb_next
        if entries and own and entries[-1].tb_frame is own[0].tb_frame:
            entries.pop()  # the frame that caught the cause: its call line, not its raise line
        entries += own
        current = current.__cause__
    return entries


def _raise_site(exc: BaseException) -> TracebackType | None:
    """The innermost entry of ``exc``'s own traceback: where airstream raised it."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def readable(exc: AirstreamError) -> AirstreamError:
    """``exc`` with a traceback a user reads: the frames of their code (the pass that raised, the
    line that raised in it) and the frame where airstream raised it; none of torch's frames or
    airstream's others. With ``TORCHDYNAMO_VERBOSE=1``, every frame, the causes' included."""
    entries = _raised_through(exc)
    if not TORCHDYNAMO_VERBOSE.read():
        site = _raise_site(exc)
        frame = site.tb_frame if site is not None else None
        entries = [
            e
            for e in entries
            if e.tb_frame is frame or not e.tb_frame.f_code.co_filename.startswith(_INTERNAL_DIRS)
        ]
    tb: TracebackType | None = None
    for entry in reversed(entries):
        tb = TracebackType(tb, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return exc.with_traceback(tb)
