"""``airstream.stream(label)``: put the ops of a ``with`` block on a stream, from model code."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.fx.traceback as fx_traceback

from airstream.ops.library import STREAM_LABEL_KEY, STREAM_PRIORITY_KEY

__all__ = ["STREAM_ANNOTATION", "STREAM_PRIORITY_ANNOTATION", "stream"]

# node.meta["custom"] keys; "stream" itself belongs to Inductor.
STREAM_ANNOTATION = "air_stream"
STREAM_PRIORITY_ANNOTATION = "air_stream_priority"


@contextlib.contextmanager
def stream(label: str, priority: int = 0) -> Iterator[None]:
    """Run the ops traced inside this block on stream ``label``.

    Under ``torch.compile`` Dynamo traces the block as ``air.scope_enter``/``air.scope_exit``
    markers (forward and inference graphs) and as the ``air_stream`` node annotation, which also
    reaches backward graphs. In eager mode it does nothing. A graph break inside the block leaves
    an unpaired scope in the graph and compilation fails with a StreamError that says so.

    Args:
        label: the stream's name; the same label is the same stream everywhere.
        priority: stream priority, used by the CUDA runtime (lower is more urgent).
    """
    if not isinstance(label, str) or not label:
        raise ValueError(f"airstream.stream: label must be a non-empty str, got {label!r}")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"airstream.stream: priority must be an int, got {priority!r}")
    if not torch.compiler.is_compiling():
        yield
        return
    torch.ops.air.scope_enter([STREAM_LABEL_KEY, STREAM_PRIORITY_KEY], [label, str(priority)])
    with fx_traceback.annotate({STREAM_ANNOTATION: label, STREAM_PRIORITY_ANNOTATION: priority}):
        try:
            yield
        finally:
            torch.ops.air.scope_exit()
