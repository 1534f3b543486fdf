"""What the CUDA graphs of one compiled function share: a memory pool per device, and with it
the order of their replays.

One Dynamo graph compiles to an inference graph, or to a forward and a backward graph; their CUDA
graphs capture into one :class:`CapturePool`, as torch's cudagraph trees capture every graph of a
tree into one pool: the forward's scratch memory, free again once its capture ends, is the
backward's. Graphs sharing a pool must never run at once, and a replay's results must be out of
the pool before the next replay overwrites them. ``CudaGraphExecutor`` copies every output that
lives in its graph's memory out right after its replay, so the rule left is order: a replay holds
:attr:`CapturePool.lock`, waits on the device for the previous replay of any graph of the pool
(:meth:`CapturePool.after_last`), and marks its own end (:meth:`CapturePool.mark_done`).

The caching allocator hands a freed block of a pool only to an allocation on the stream that
freed it, so every capture runs on one stream per device (``CudaApi.capture_stream``): the
backward, captured on autograd's device thread, reuses what the forward freed.

The pool also says what the backward may read where it lies (:attr:`CapturePool.weights`, the
forward's parameters and buffers; :meth:`CapturePool.handed`, the tensors the forward hands over
in the pool's memory for the backward), so that no weight and no saved activation is copied per
replay.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["CapturePool"]


class CapturePool:
    """The memory pool and replay order the CUDA graphs of one compiled function share."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held by a capture or replay of any graph of the pool
        self._memory: dict[int, Any] = {}  # device index -> its MemPool, made at first capture
        self._done: dict[int, Any] = {}  # device index -> event after the last replay's copies
        self.weights: frozenset[int] = frozenset()  # storages captured by address (parameters)
        self._handed: dict[int, frozenset[int]] = {}  # id(graph executor) -> storages handed over

    def add_weights(self, storages: set[int]) -> None:
        """Storages a graph of the pool captured by address (its parameters and buffers); call
        with :attr:`lock`."""
        self.weights = self.weights | storages

    def set_handed(self, owner: object, storages: set[int]) -> None:
        """The storages ``owner`` (a forward's executor) hands over at each replay; call with
        :attr:`lock`."""
        self._handed[id(owner)] = frozenset(storages)

    def handed(self) -> frozenset[int]:
        """Every storage a graph of the pool hands over in place."""
        return frozenset().union(*self._handed.values())

    def memory(self, api: Any, device: torch.device) -> Any:
        """The pool's memory on ``device`` (a ``torch.cuda.MemPool``); call with :attr:`lock`."""
        index = device.index or 0
        pool = self._memory.get(index)
        if pool is None:
            pool = self._memory[index] = api.new_pool()
        return pool

    def after_last(self, stream: Any, device: torch.device) -> None:
        """``stream`` waits for the last replay of any graph of the pool on ``device`` (its reads
        of the input buffers and its output copies) before it writes into the pool's memory."""
        done = self._done.get(device.index or 0)
        if done is not None:
            stream.wait_event(done)

    def mark_done(self, api: Any, stream: Any, device: torch.device) -> None:
        """A replay and its output copies, issued on ``stream``, are the pool's last work."""
        index = device.index or 0
        done = self._done.get(index)
        if done is None:
            done = self._done[index] = api.new_event()
        done.record(stream)

    def wait_idle(self, device: torch.device) -> None:
        """The host waits until no replay of the pool's graphs on ``device`` runs (before a
        capture frees memory a replay in flight may still use)."""
        done = self._done.get(device.index or 0)
        if done is not None:
            done.synchronize()
