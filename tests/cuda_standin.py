"""A stand-in for the CUDA calls of airstream's runtime, for machines without a GPU.

:class:`StandInCuda` subclasses the runtime's :class:`~airstream.runtime.cuda_api.CudaApi`,
replacing each CUDA primitive with bookkeeping that follows CUDA's and torch's rules where the
runtime depends on them: ``set_stream`` also switches the current device; a stream joins a capture
by waiting on an event recorded in it, and stays in it until the capture ends; an op that is not
allowed in a capture invalidates it, after which ``capture_end`` ends the capture and raises;
capture cannot begin on a default stream. What torch itself undoes after a failed capture differs
by release, and the stand-in follows the one it is told (``release``): 2.11's ``capture_end``
raises before the allocator hears the capture ended, later ones after; 2.15's ``reset`` also
ends the allocator's redirect and releases the pool of a capture that never ended, earlier ones
release only the pool of a capture that did. A pool's use count going below zero (which makes
every later ``empty_cache`` fail in torch) is recorded in ``violations``.
Every call is logged, so tests check the order of what the runtime issued. Ops compute on the CPU
right away; a "replay" recomputes the captured call on the captured tensors.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from airstream.runtime.cuda_api import CudaApi


class Stream:
    def __init__(self, api: StandInCuda, name: str, device: int, priority: int = 0) -> None:
        self.api, self.name, self.device, self.priority = api, name, device, priority

    def wait_event(self, event: Event) -> None:
        self.api.log_call("wait_event", self.name, event.name)
        if event.capture is not None:  # waiting on captured work: this stream joins
            self.api.join(self, event.capture)

    def wait_stream(self, other: Stream) -> None:
        self.api.log_call("wait_stream", self.name, other.name)
        graph = self.api.capture_of.get(other)
        if graph is not None:
            self.api.join(self, graph)

    def __repr__(self) -> str:
        return f"<stream {self.name} on cuda:{self.device}>"


class Event:
    def __init__(self, api: StandInCuda, name: str) -> None:
        self.api, self.name = api, name
        self.capture: Graph | None = None

    def record(self, stream: Stream) -> None:
        self.api.log_call("record", stream.name, self.name)
        self.capture = self.api.capture_of.get(stream)

    def synchronize(self) -> None:
        self.api.log_call("synchronize", self.name)


class Pool:
    """A torch.cuda.MemPool: it holds one use of the pool itself."""

    def __init__(self, api: StandInCuda, name: str) -> None:
        self.api, self.id, self.uses = api, (0, name), 1

    def use_count(self) -> int:
        return self.uses

    def release(self) -> None:
        self.uses -= 1
        if self.uses < 0:
            self.api.violations.append(f"pool {self.id} released below zero uses")


class Graph:
    def __init__(self, api: StandInCuda, name: str) -> None:
        self.api, self.name = api, name
        self.invalid = False
        self.began = False
        self.ended = False
        self.resets = 0
        self.pool: Pool | None = None
        self.replay_fn: Callable[[], None] | None = None

    def reset(self) -> None:
        self.resets += 1
        pool = self.pool
        if pool is None:
            return
        if self.ended or (self.api.release >= (2, 15) and self.began):
            self.api.pools_allocating.discard(pool)
            pool.release()
        self.pool = None
        self.began = self.ended = False


class StandInCuda(CudaApi):
    """Logs and checks the runtime's CUDA calls; see the module docstring."""

    def __init__(self, pool_size: int = 32, release: tuple[int, int] = (2, 15)) -> None:
        super().__init__()
        self.stream_pool_size = pool_size
        self.release = release  # the torch release whose capture cleanup is modelled
        self.violations: list[str] = []
        self.log: list[tuple[Any, ...]] = []
        self._thread = threading.local()  # current device and streams are per thread, as in CUDA
        self.capture_of: dict[Stream, Graph] = {}  # streams in a capture -> its graph
        self.capture_origin: dict[Graph, Stream] = {}
        self.pools_allocating: set[Pool] = set()  # pools a capture allocates into
        self.pools: list[Pool] = []
        self.concurrent_captures = 0
        self.most_concurrent = 0
        self.fail_in_capture = False  # the next keep() inside a capture is an illegal op
        self.capture_delay = 0.0
        self.pool_draws: list[tuple[int, int]] = []  # (device, priority) of each pool stream
        self.dedicated: list[Stream] = []  # streams created outside torch's pool
        self.dedicated_streams = True  # False: the CUDA runtime library was not found
        self._names = itertools.count()
        self._defaults: dict[int, Stream] = {}
        self._quiet = threading.local()
        self._log_lock = threading.Lock()

    # --- bookkeeping ----------------------------------------------------------------------------

    @property
    def device_now(self) -> int:
        return int(getattr(self._thread, "device", 0))

    @device_now.setter
    def device_now(self, value: int) -> None:
        self._thread.device = value

    @property
    def _current(self) -> dict[int, Stream]:
        current: dict[int, Stream] | None = getattr(self._thread, "streams", None)
        if current is None:
            current = self._thread.streams = {}
        return current

    def log_call(self, *entry: Any) -> None:
        if not getattr(self._quiet, "on", False):
            with self._log_lock:
                self.log.append(entry)

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        self._quiet.on = True
        try:
            yield
        finally:
            self._quiet.on = False

    def default_stream(self, device: int) -> Stream:
        if device not in self._defaults:
            self._defaults[device] = Stream(self, f"default:{device}", device)
        return self._defaults[device]

    def join(self, stream: Stream, graph: Graph) -> None:
        self.capture_of[stream] = graph

    def current(self) -> Stream:
        return self._current.get(self.device_now) or self.default_stream(self.device_now)

    def capturing_graph(self) -> Graph | None:
        return self.capture_of.get(self.current())

    # --- CudaApi primitives ---------------------------------------------------------------------

    def new_stream(self, device: torch.device, priority: int) -> Stream:
        index = device.index or 0
        least, greatest = self.priority_range()
        # torch's pool refuses a positive priority and folds those past the most urgent
        assert greatest <= priority <= least, f"priority {priority} outside torch's pool"
        self.pool_draws.append((index, priority))
        return Stream(self, f"s{next(self._names)}", index, priority)

    def new_dedicated_stream(self, device: torch.device, priority: int) -> Stream | None:
        if not self.dedicated_streams:
            return None
        stream = Stream(self, f"d{next(self._names)}", device.index or 0, priority)
        self.dedicated.append(stream)
        return stream

    def priority_range(self) -> tuple[int, int]:
        return (0, -5)  # an H100's: priorities 0 (least urgent) to -5

    def new_event(self) -> Event:
        event = Event(self, f"e{next(self._names)}")
        self.log_call("new_event", event.name)
        return event

    def adopt_stream(self, stream: Any) -> Any:
        assert isinstance(stream, Stream), f"a user's stream must be a stand-in stream: {stream}"
        return stream

    def synchronize_device(self) -> None:
        self.log_call("synchronize_device", self.device_now)

    def current_stream(self, device: torch.device) -> Stream:
        index = device.index or 0
        return self._current.get(index) or self.default_stream(index)

    def set_stream(self, stream: Stream) -> None:
        self.log_call("use", stream.name)
        self._current[stream.device] = stream
        self.device_now = stream.device  # as torch.cuda.set_stream does

    @contextlib.contextmanager
    def device(self, device: torch.device) -> Iterator[None]:
        before = self.device_now
        self.device_now = device.index or 0
        try:
            yield
        finally:
            self.device_now = before

    def keep(self, value: Any, stream: Stream) -> None:
        graph = self.capture_of.get(stream)
        if graph is not None and self.fail_in_capture:
            self.fail_in_capture = False
            graph.invalid = True
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        if isinstance(value, torch.Tensor):
            self.log_call("keep", stream.name, id(value), graph is not None)

    def capturing(self) -> bool:
        return self.capturing_graph() is not None

    def new_graph(self) -> Graph:
        return Graph(self, f"g{next(self._names)}")

    def new_pool(self) -> Pool:
        pool = Pool(self, f"p{next(self._names)}")
        self.pools.append(pool)
        return pool

    def capture_begin(self, graph: Graph, pool: Pool) -> None:
        stream = self.current()
        assert not stream.name.startswith("default"), "capture on a default stream"
        assert stream not in self.capture_of, "capture begun on a stream already capturing"
        self.concurrent_captures += 1
        self.most_concurrent = max(self.most_concurrent, self.concurrent_captures)
        time.sleep(self.capture_delay)
        self.log_call("capture_begin", stream.name, graph.name, self.device_now)
        self.capture_of[stream] = graph
        self.capture_origin[graph] = stream
        self.pools_allocating.add(pool)
        pool.uses += 1
        graph.pool, graph.began = pool, True

    def _end(self, graph: Graph) -> None:
        for stream in [s for s, g in self.capture_of.items() if g is graph]:
            del self.capture_of[stream]
        self.concurrent_captures -= 1

    def capture_end(self, graph: Graph) -> None:
        stream = self.current()
        assert self.capture_origin.get(graph) is stream, "capture must end on its own stream"
        self.log_call("capture_end", stream.name, graph.name)
        self._end(graph)
        if graph.invalid and self.release < (2, 13):  # raises before telling the allocator
            raise RuntimeError("CUDA error: operation failed due to an earlier error in capture")
        assert graph.pool is not None
        self.pools_allocating.discard(graph.pool)
        if graph.invalid:
            raise RuntimeError("CUDA error: operation failed due to an earlier error in capture")
        graph.ended = True

    def replay(self, graph: Graph) -> None:
        assert graph.ended, "replay of a graph that was not captured"
        self.log_call("replay", self.current().name, graph.name)
        if graph.replay_fn is not None:
            with self.quiet():
                graph.replay_fn()

    def end_allocate_to_pool(self, device: int, pool: Pool) -> None:
        self.log_call("end_allocate_to_pool", device)
        if pool not in self.pools_allocating:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
        self.pools_allocating.discard(pool)

    def release_pool(self, device: int, pool: Pool) -> None:
        self.log_call("release_pool", device)
        pool.release()

    def clear_cublas_workspaces(self) -> None:
        self.log_call("clear_cublas_workspaces")

    # --- what tests read ------------------------------------------------------------------------

    def calls(self, kind: str) -> list[tuple[Any, ...]]:
        return [entry for entry in self.log if entry[0] == kind]
