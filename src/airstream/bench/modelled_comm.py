"""Communication as a modelled delay: a process group whose collectives take
``alpha + beta * bytes`` seconds on one simulated link and move no data
(``airstream bench microbatch --comm modelled``).

A collective returns at once; its ``wait`` sleeps (the GIL released) until the link has carried
it, after any collective issued before it (one link: they queue). ``all_reduce`` leaves its tensor
as it is and ``all_to_all_single`` copies its input to its output (equal splits): the values are
one rank's, the timings those of ``world`` ranks on a link of that latency and bandwidth, free of
this machine's memory-copy contention between processes. It is what separates the schedule's
quality from the machine's: with real gloo ranks on two cores, a collective's copies compete with
the other micro-batch's compute for the same cores.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

from airstream.torch_internals import python_process_group

__all__ = ["GROUP_NAME", "init_modelled", "modelled_seconds"]

GROUP_NAME = "airstream_modelled"
_BACKEND = "airstream_modelled"


def _classes(alpha: float, beta: float, world: int) -> Any:
    base, work_base, _ = python_process_group()

    class _Work(work_base):  # type: ignore[misc,valid-type]
        def __init__(self, ready_at: float, tensors: list[torch.Tensor]) -> None:
            super().__init__()
            self.ready_at = ready_at
            self.future: torch.futures.Future[Any] = torch.futures.Future()
            self.future.set_result(tensors)

        def wait(self, timeout: Any = None) -> bool:
            left = self.ready_at - time.perf_counter()
            if left > 0:
                time.sleep(left)
            return True

        def get_future(self) -> Any:
            return self.future

    class _Group(base):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__(0, world)
            self.free_at = 0.0
            self.carried = 0.0  # seconds of communication issued
            self.scale = 1.0  # 0: communication costs nothing (each runner's compute alone)
            self.lock = threading.Lock()

        def _issue(self, tensors: list[torch.Tensor]) -> _Work:
            cost = self.scale * (alpha + beta * sum(t.numel() * t.element_size() for t in tensors))
            with self.lock:
                start = max(time.perf_counter(), self.free_at)
                self.free_at = start + cost
                self.carried += cost
                return _Work(self.free_at, tensors)

        def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> _Work:
            return self._issue(tensors)

        def alltoall_base(
            self,
            output: torch.Tensor,
            input: torch.Tensor,
            out_splits: Any,
            in_splits: Any,
            opts: Any = None,
        ) -> _Work:
            output.copy_(input)
            return self._issue([input])

        def size(self) -> int:
            return world

        def getBackendName(self) -> str:
            return _BACKEND

        def getGroupName(self) -> str:
            return GROUP_NAME

        def getGroupDesc(self) -> str:
            return GROUP_NAME

    return _Group


def init_modelled(world: int, alpha: float, beta: float) -> Any:
    """Make a modelled group of ``world`` simulated ranks (this process is rank 0) the default
    process group; returns it (its ``carried``: the seconds of communication issued)."""
    group_class = _classes(alpha, beta, world)
    made: list[Any] = []

    def create(store: Any, rank: int, size: int, timeout: Any) -> Any:
        made.append(group_class())
        return made[-1]

    if _BACKEND in dist.Backend.backend_list:
        raise RuntimeError("init_modelled: one modelled group per process")
    with warnings.catch_warnings():  # it asks for devices, but naming them wraps the group
        warnings.simplefilter("ignore")
        dist.Backend.register_backend(_BACKEND, create)
    dist.init_process_group(_BACKEND, store=dist.HashStore(), rank=0, world_size=1)
    _, _, register = python_process_group()
    register(GROUP_NAME, made[-1])
    return made[-1]


def modelled_seconds(group: Any) -> float:
    """The seconds of communication ``group`` has carried so far."""
    return float(group.carried)
