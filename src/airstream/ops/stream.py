"""``airstream.stream(label)``: put the ops of a ``with`` block on a stream, from model code."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from airstream.ops.library import STREAM_LABEL_KEY, STREAM_PRIORITY_KEY
from airstream.torch_internals import annotate, dynamo_skip, eval_frame_callback_getter

__all__ = ["STREAM_ANNOTATION", "STREAM_PRIORITY_ANNOTATION", "eager_under_torch_compile", "stream"]

# node.meta["custom"] keys; "stream" itself belongs to Inductor.
STREAM_ANNOTATION = "air_stream"
STREAM_PRIORITY_ANNOTATION = "air_stream_priority"


_eval_frame_callback = eval_frame_callback_getter()  # a C function, or None


@dynamo_skip  # never traced, and the frame hook stays visible inside
def eager_under_torch_compile() -> bool:
    """True when eager code runs inside a torch.compile'd call (Dynamo's frame hook is set).
    Only C calls in here: a Python call would open a frame Dynamo tries to compile."""
    get = _eval_frame_callback
    return get is not None and get() not in (None, False)


@contextlib.contextmanager
def stream(label: str, priority: int = 0) -> Iterator[None]:
    """Run the ops traced inside this block on stream ``label``.

    Under ``torch.compile`` Dynamo traces the block as ``air.scope_enter``/``air.scope_exit``
    markers (forward and inference graphs) and as the ``air_stream`` node annotation, which also
    reaches backward graphs. In eager mode it does nothing.

    A graph break inside the block makes Dynamo give up on the whole frame and run it eagerly
    (results stay correct, the streams are lost); airstream then warns, naming the label, since
    the block ran eagerly under torch.compile. Find the break with ``fullgraph=True``.

    Args:
        label: the stream's name; the same label is the same stream everywhere.
        priority: stream priority, used by the CUDA runtime (lower is more urgent).
    """
    if not isinstance(label, str) or not label:
        raise ValueError(f"airstream.stream: label must be a non-empty str, got {label!r}")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"airstream.stream: priority must be an int, got {priority!r}")
    if not torch.compiler.is_compiling():
        if eager_under_torch_compile():
            warnings.warn(
                f"airstream.stream({label!r}) ran eagerly inside a torch.compile'd call: Dynamo "
                "fell back to eager for this frame, usually because of a graph break inside the "
                "stream block, so its ops run without streams. Compile with fullgraph=True to "
                "see the break, and move it out of the block.",
                stacklevel=3,
            )
        yield
        return
    torch.ops.air.scope_enter([STREAM_LABEL_KEY, STREAM_PRIORITY_KEY], [label, str(priority)])
    with annotate({STREAM_ANNOTATION: label, STREAM_PRIORITY_ANNOTATION: priority}):
        try:
            yield
        finally:
            torch.ops.air.scope_exit()
