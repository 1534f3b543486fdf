"""Every CUDA call the CUDA runtime makes, and the streams it owns, behind one object.

:class:`CudaApi` is the seam between airstream's CUDA executors and ``torch.cuda``: streams,
events, the current stream and device, ``record_stream``, graph capture and its cleanup. The
executors take one (``CUDA``, the process's, by default); the test suite passes a stand-in that
logs and checks every call, so the protocol (device guards, capture cleanup, the join on the error
path, which streams join a capture) is checked on machines without a GPU.

Two kinds of stream are used here:

- **label streams**, drawn from torch's per-device pool (32 per priority level, handed out round
  robin and shared with everything else in the process), one per ``(device, label, priority)``
  for the whole process: every graph's ``"side"`` work runs on one CUDA stream, as TorchAir's
  labels do. Drawing more than the pool holds makes two of them the same CUDA stream (their work
  serializes): warned about once, naming what shares, counted per priority level torch actually
  uses (a priority outside the device's range is clamped into it, with one warning, where
  torch's own pool would refuse a positive one);
- **dedicated streams**, created for airstream alone (``cudaStreamCreateWithPriority``, not
  from the pool, so no other library or user stream can be handed the same one): the capture
  stream (one per device: every airstream capture and its warm-up runs on it, one at a time under
  :attr:`CudaApi.capture_lock`; one, because the caching allocator reuses a pool's freed block
  only on the stream that freed it, and a forward and its backward share a pool:
  :mod:`airstream.runtime.capture_pool`), and private streams (per thread and device: the side
  streams of any call issued while its caller's stream is capturing). A stream joins a capture
  when it waits on the capture's work and stays in it until the capture ends, so a stream
  another thread might use meanwhile must never join one. Where the CUDA runtime library cannot
  be reached to create one, a pool stream stands in, with one warning.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import warnings
from typing import Any

import torch

from airstream import torch_internals

__all__ = ["CUDA", "CudaApi"]


class CudaApi:
    """The CUDA calls of airstream's runtime (real ones; tests subclass it with stand-ins)."""

    stream_pool_size = 32  # torch's streams per device and priority level (kStreamsPerPool)

    def __init__(self) -> None:
        self._labels: dict[tuple[int, str, int], Any] = {}
        self._drawn: dict[tuple[int, int], list[str]] = {}  # (device, priority) -> what was drawn
        self._lock = threading.Lock()
        self._local = threading.local()
        # One airstream capture at a time in the process: a capture clears the cached cuBLAS
        # workspaces, which another capture in progress may have baked into its graph; and every
        # capture runs on the one capture stream of its device.
        self.capture_lock = threading.Lock()
        self._capture_streams: dict[int, Any] = {}
        self._clamped: set[int] = set()  # priorities warned about as outside the device's range
        self._range: tuple[int, int] | None = None
        self._pool_fallback_warned = False

    # --- priorities ----------------------------------------------------------------------------

    def priority_range(self) -> tuple[int, int]:
        """``(least, greatest)`` stream priority torch's pool has (0 and a negative number: lower
        is more urgent)."""
        if self._range is None:
            least, greatest = torch.cuda.Stream.priority_range()  # type: ignore[call-arg]
            self._range = int(least), int(greatest)
        return self._range

    def stream_priority(self, priority: int) -> int:
        """``priority`` clamped into :meth:`priority_range`, the level a stream really gets (torch
        refuses a positive one and folds those past the most urgent into it); one warning per
        value outside the range."""
        least, greatest = self.priority_range()
        level = min(max(priority, greatest), least)
        if level != priority and priority not in self._clamped:
            self._clamped.add(priority)
            warnings.warn(
                f"airstream: stream priority {priority} is outside this device's range "
                f"[{greatest}, {least}] (lower is more urgent); the stream runs at priority "
                f"{level}. Use a priority in the range.",
                stacklevel=4,
            )
        return level

    # --- streams and events ------------------------------------------------------------------

    def new_stream(self, device: torch.device, priority: int) -> Any:
        """A stream from torch's pool for ``device`` (``priority`` in :meth:`priority_range`)."""
        return torch.cuda.Stream(device=device, priority=priority)

    def new_dedicated_stream(self, device: torch.device, priority: int) -> Any:
        """A non-blocking stream created for airstream alone (not from torch's pool, which
        other code shares), or None where the CUDA runtime library cannot be reached."""
        create = _stream_create()
        if create is None:
            return None
        handle = ctypes.c_void_p()
        with torch.cuda.device(device):  # a stream belongs to the device current at creation
            status = create(ctypes.byref(handle), _NON_BLOCKING, priority)
        if status != 0 or not handle.value:
            return None
        return torch.cuda.ExternalStream(handle.value, device=device)

    def new_event(self) -> Any:
        """A new event (created on the device of the stream it is first recorded on)."""
        return torch.cuda.Event()

    def current_stream(self, device: torch.device) -> Any:
        """The calling thread's current stream on ``device``."""
        return torch.cuda.current_stream(device)

    def adopt_stream(self, stream: Any) -> Any:
        """A user's stream as a ``torch.cuda.Stream`` (the same CUDA stream): a generic
        ``torch.Stream`` on a CUDA device is wrapped, a CUDA stream is returned as it is."""
        if isinstance(stream, torch.cuda.Stream):
            return stream
        return torch.cuda.Stream(
            stream_id=stream.stream_id,
            device_index=stream.device_index,
            device_type=stream.device_type,
        )

    def synchronize_device(self) -> None:
        """The host waits for all work on the current device."""
        torch.cuda.synchronize()

    def set_stream(self, stream: Any) -> None:
        """Make ``stream`` the thread's current stream on its device (this also makes its device
        the current device: callers run inside :meth:`device`)."""
        torch.cuda.set_stream(stream)

    def device(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """Context manager: ``device`` is the current device inside; the caller's after."""
        return torch.cuda.device(device)

    def keep(self, value: Any, stream: Any) -> None:
        """The caching allocator must not reuse ``value``'s memory before ``stream``'s work queued
        so far has run (``record_stream``; also legal, and needed, inside a capture)."""
        if isinstance(value, torch.Tensor) and value.is_cuda:
            value.record_stream(stream)

    def capturing(self) -> bool:
        """The current stream (of the current device) is capturing a CUDA graph."""
        return torch.cuda.is_current_stream_capturing()

    @contextlib.contextmanager
    def own_capture(self) -> Any:
        """Context manager: this thread is inside a capture airstream began (not the user's
        own ``torch.cuda.graph``), as :meth:`capturing_own` reports."""
        self._local.own = True
        try:
            yield
        finally:
            self._local.own = False

    def capturing_own(self) -> bool:
        """Inside :meth:`own_capture` on this thread."""
        return bool(getattr(self._local, "own", False))

    # --- graphs ------------------------------------------------------------------------------

    def new_graph(self) -> Any:
        """An empty CUDA graph."""
        return torch.cuda.CUDAGraph()

    def new_pool(self) -> Any:
        """A private memory pool for one capture (a ``torch.cuda.MemPool``: it holds one use of
        the pool itself, and says how many uses there are)."""
        return torch.cuda.MemPool()

    def capture_begin(self, graph: Any, pool: Any) -> None:
        """Start capturing the current stream's work into ``graph``, allocating from ``pool``.

        Thread-local capture mode: other threads' CUDA calls neither fail this capture nor are
        refused because of it (the default, global mode refuses them all)."""
        graph.capture_begin(pool=pool.id, capture_error_mode="thread_local")

    def capture_end(self, graph: Any) -> None:
        """End the capture begun on the current stream and instantiate the graph."""
        graph.capture_end()

    def replay(self, graph: Any) -> None:
        """Launch ``graph`` on the current stream."""
        graph.replay()

    def end_allocate_to_pool(self, device: int, pool: Any) -> None:
        """Tell the caching allocator no capture allocates into ``pool`` any more."""
        torch_internals.end_allocate_to_pool(device, pool.id)

    def release_pool(self, device: int, pool: Any) -> None:
        """Drop the capture's use of ``pool`` (its memory returns once unused)."""
        torch_internals.release_pool(device, pool.id)

    def abandon_capture(self, graph: Any, pool: Any, device: torch.device, uses: int) -> None:
        """Undo a capture that failed, leaving the stream, the allocator and the graph as if it
        had never started; called with the capture stream current.

        What torch undoes itself differs by release. When CUDA reports a capture invalidated
        (an op that synchronized, a copy to the host), ``capture_end`` raises; torch 2.11 raises
        before telling the allocator the capture is over (which then defers every
        ``record_stream``-ed free for good: memory grows until it runs out), later releases tell
        it first; 2.15's ``reset`` also releases the pool of a capture that never ended, earlier
        ones only that of one that did. So: end the capture, reset the graph, end the
        allocator's redirect (raises where torch did it already), and release the capture's
        use of the pool only if it still holds one; a second release would leave the pool's
        use count below zero, and every later ``empty_cache`` would fail. ``uses``: the pool's
        use count before the capture began (other graphs' captures into a shared pool hold theirs).
        The original error is the one that counts: the undo steps' own errors are dropped.
        """
        index = _index(device)
        if self.capturing():
            with contextlib.suppress(Exception):
                self.capture_end(graph)  # ends the capture even when it then raises
        with contextlib.suppress(Exception):
            graph.reset()
        with contextlib.suppress(Exception):
            self.end_allocate_to_pool(index, pool)
        if pool.use_count() > uses:  # the capture's use is still held
            with contextlib.suppress(Exception):
                self.release_pool(index, pool)

    def clear_cublas_workspaces(self) -> None:
        """Drop cached cuBLAS workspaces (before and after a capture)."""
        torch_internals.clear_cublas_workspaces()

    # --- the streams airstream owns ----------------------------------------------------------

    def label_stream(self, device: torch.device, label: str, priority: int = 0) -> Any:
        """The process-wide stream of ``label`` on ``device`` (same label, same stream)."""
        level = self.stream_priority(priority)
        key = (_index(device), label, level)
        stream = self._labels.get(key)
        if stream is None:
            with self._lock:
                stream = self._labels.get(key)
                if stream is None:
                    stream = self._labels[key] = self._draw(device, level, f"label {label!r}")
        return stream

    def capture_stream(self, device: torch.device) -> Any:
        """The stream every airstream capture on ``device`` runs on; use it only while holding
        :attr:`capture_lock` (see the module doc)."""
        index = _index(device)
        stream = self._capture_streams.get(index)
        if stream is None:
            with self._lock:
                stream = self._capture_streams.get(index)
                if stream is None:
                    stream = self._capture_streams[index] = self._dedicated(device, 0, "capture")
        return stream

    def private_stream(self, device: torch.device, slot: str, priority: int = 0) -> Any:
        """This thread's own stream ``slot`` on ``device`` (for calls issued into a capture; see
        the module doc)."""
        streams: dict[tuple[int, str, int], Any] | None = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        level = self.stream_priority(priority)
        key = (_index(device), slot, level)
        stream = streams.get(key)
        if stream is None:
            name = f"{slot} of thread {threading.current_thread().name!r}"
            with self._lock:
                stream = streams[key] = self._dedicated(device, level, name)
        return stream

    def _dedicated(self, device: torch.device, priority: int, name: str) -> Any:
        """A dedicated stream, else (one warning) a stream from the pool (called locked)."""
        stream = self.new_dedicated_stream(device, priority)
        if stream is not None:
            return stream
        if not self._pool_fallback_warned:
            self._pool_fallback_warned = True
            warnings.warn(
                "airstream: could not create CUDA streams of its own (the CUDA runtime library "
                "torch loaded was not found); its capture and private streams come from torch's "
                "shared stream pool, where another library's or thread's work on the same stream "
                "could join a capture",
                stacklevel=4,
            )
        return self._draw(device, priority, name)

    def _draw(self, device: torch.device, priority: int, name: str) -> Any:
        """A stream from the pool, warning once when it is one drawn before (called locked;
        ``priority`` already clamped: torch's pool has one round robin per level)."""
        drawn = self._drawn.setdefault((_index(device), priority), [])
        drawn.append(name)
        size = self.stream_pool_size
        if len(drawn) == size + 1:
            warnings.warn(
                f"airstream: more than {size} CUDA streams drawn on cuda:{_index(device)} at "
                f"priority {priority}, the size of torch's stream pool: from now on streams are "
                f"shared, and the work of two sharing ones runs one after the other ({name} "
                f"shares with {drawn[0]}, and so on). Use fewer stream labels.",
                stacklevel=4,
            )
        return self.new_stream(device, priority)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else 0


_NON_BLOCKING = 0x01  # cudaStreamNonBlocking: no implicit sync with the legacy default stream


@functools.cache
def _stream_create() -> Any:
    """``cudaStreamCreateWithPriority`` of the CUDA runtime library torch loaded, or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
    except OSError:  # not Linux
        paths = set()
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).cudaStreamCreateWithPriority
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
        return fn
    return None


CUDA = CudaApi()
