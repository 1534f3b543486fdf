"""Stream workers: one persistent daemon thread per side-stream label, shared process-wide.

Like CUDA streams, the same label is the same worker everywhere, so the number of threads is
bounded by the number of distinct labels, however many graphs are compiled. Jobs are submitted
under one process-wide lock so that every worker sees concurrent calls in the same order: a
call's jobs never queue behind a later call's jobs on one worker and ahead of them on another,
which is what would let two concurrent calls deadlock.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence

__all__ = ["StreamWorker", "submit_all", "worker_count", "worker_for"]

_registry: dict[str, StreamWorker] = {}
_registry_lock = threading.Lock()
_submit_lock = threading.Lock()


class StreamWorker:
    """A daemon thread that runs submitted jobs one after another, in submission order."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.thread = threading.Thread(
            target=self._loop, name=f"airstream-stream-{label}", daemon=True
        )
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            job()  # jobs catch their own exceptions (see runtime.cpu)
            del job  # a finished call's job must not keep its tensors alive until the next one

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; prefer :func:`submit_all` for the jobs of one call."""
        self._jobs.put(job)


def worker_for(label: str) -> StreamWorker:
    """The process-wide worker of stream ``label`` (created on first use)."""
    worker = _registry.get(label)
    if worker is None:
        with _registry_lock:
            worker = _registry.get(label)
            if worker is None:
                worker = _registry[label] = StreamWorker(label)
    return worker


def submit_all(jobs: Sequence[tuple[StreamWorker, Callable[[], None]]]) -> None:
    """Queue the side-stream jobs of one call atomically with respect to other calls."""
    with _submit_lock:
        for worker, job in jobs:
            worker.submit(job)


def worker_count() -> int:
    """How many stream workers exist in this process."""
    return len(_registry)
