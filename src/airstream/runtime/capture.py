"""One CUDA graph capture of a call, made safely (:func:`capture_call`): the warm-up calls on the
device's capture stream, then the capture into the pool; should anything fail on the way, what
was made is undone and the process is as before (:class:`CaptureFailed`). And the copies a capture
makes of its inputs, with their strides (:func:`copy_like`).
:class:`airstream.runtime.cuda_graphs.CudaGraphExecutor` decides when to capture and replays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.cuda import CudaExecutor

__all__ = [
    "CaptureFailed",
    "Captured",
    "capture_call",
    "copy_like",
    "empty_strided_like",
    "expanded",
]


class CaptureFailed(RuntimeError):
    """CUDA graph capture failed; the process was left as before it started."""


def expanded(value: torch.Tensor) -> bool:
    """Does ``value`` repeat memory (a stride of 0), which no copy can share memory like?"""
    layout = zip(value.shape, value.stride(), strict=True)
    return any(stride == 0 and size > 1 for size, stride in layout)


def empty_strided_like(value: torch.Tensor) -> torch.Tensor:
    """Uninitialized memory with ``value``'s strides (``empty_like`` makes gaps contiguous)."""
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)


def copy_like(value: Any) -> Any:
    """A copy of ``value`` with its strides (``clone`` makes a tensor with gaps contiguous); an
    expanded tensor comes back contiguous."""
    if not isinstance(value, torch.Tensor):
        return value
    if expanded(value):
        return value.clone(memory_format=torch.contiguous_format)
    out = empty_strided_like(value)
    out.copy_(value)
    return out


@dataclass(frozen=True)
class Captured:
    """A capture made: the graph, what it reads per input (its own copy, or the input itself
    where it reads it by address), its outputs in the pool's memory, and the stream it was
    captured on."""

    graph: Any
    inputs: list[Any]
    outputs: Any
    stream: Any


def capture_call(
    inner: CudaExecutor,
    pool: CapturePool,
    args: Sequence[Any],
    by_address: Collection[int],
    written: Collection[int],
    warmup: int,
) -> Captured:
    """Warm ``inner`` up ``warmup`` times, then capture one call of it on the device's capture
    stream into ``pool``. ``by_address``: the inputs the graph reads where they are (the others
    are copied into buffers of its own); ``written``: of those, the ones the graph writes (the
    warm-up writes copies of them, so that each call writes once)."""
    api, device = inner.api, inner.device
    caller = api.current_stream(device)
    inputs = [copy_like(a) if i not in by_address else a for i, a in enumerate(args)]
    # a parameter or buffer the graph writes is written by the replay only, once per call
    warm = [copy_like(a) if i in written else a for i, a in enumerate(inputs)]
    with api.capture_lock:
        stream = api.capture_stream(device)
        stream.wait_stream(caller)  # the input copies, and whatever made the inputs
        # made on the caller's stream, used on the capture stream: kept until it is done
        for i, value in enumerate(warm):
            if i not in by_address or i in written:
                api.keep(value, stream)
        api.set_stream(stream)
        try:
            for _ in range(warmup):  # a model error here is the caller's to see
                inner(list(warm))
            del warm
            graph, memory, uses = _begin(inner, pool)
            try:
                with api.own_capture():
                    outputs = inner(list(inputs))
                api.capture_end(graph)
            except BaseException as error:
                api.set_stream(stream)
                api.abandon_capture(graph, memory, device, uses)
                if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit
                    raise
                raise CaptureFailed(f"{type(error).__name__}: {error}") from error
            finally:
                with contextlib.suppress(Exception):  # the capture's outcome counts
                    api.clear_cublas_workspaces()
        finally:
            api.set_stream(caller)
            caller.wait_stream(stream)  # replays come after the warm-up's work
    return Captured(graph, inputs, outputs, stream)


def _begin(inner: CudaExecutor, pool: CapturePool) -> tuple[Any, Any, int]:
    """Side streams drawn, graph and pool made, workspaces cleared, capture begun; a failure
    on the way is a failed capture, with what was made undone."""
    api, device = inner.api, inner.device
    graph = memory = None
    uses = 0
    try:
        inner.side_streams(capturing=True)  # drawn now, not inside the capture
        graph, memory = api.new_graph(), pool.memory(api, device)
        uses = memory.use_count()
        # The capture allocates its own cuBLAS workspace inside its pool: one cached by the
        # warm-up (outside the pool) would be baked into the graph, then reused.
        api.clear_cublas_workspaces()
        api.capture_begin(graph, memory)
    except Exception as error:
        if graph is not None and memory is not None:
            api.abandon_capture(graph, memory, device, uses)
        why = f"setting the capture up: {type(error).__name__}: {error}"
        raise CaptureFailed(why) from error
    return graph, memory, uses
