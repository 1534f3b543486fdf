"""Stream workers: one persistent daemon thread per side-stream label, shared process-wide.

Like CUDA streams, the same label is the same worker everywhere, so the number of threads is
bounded by the number of distinct labels, however many graphs are compiled. Jobs are submitted
under one process-wide lock so that every worker sees concurrent calls in the same order: a
call's jobs never queue behind a later call's jobs on one worker and ahead of them on another,
which is what would let two concurrent calls deadlock.

A worker waits for jobs on a flag (``runtime/handoff.py``: spinning a little, without the GIL,
after each job, where the extension is built), and a job may return a flag that the worker sets
only once it has let go of the GIL: the caller waiting on it then takes the GIL at once.

A forked child has only the thread that forked: the workers' threads are gone, and a lock another
thread held is held forever. An at-fork handler gives the child fresh locks and marks every
worker unstarted, so each starts a new thread on its first job there (executors keep their
workers: the same objects, new threads).
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from airstream.runtime.handoff import SPIN_NS, flag_type

__all__ = ["Job", "StreamWorker", "submit_all", "worker_count", "worker_for"]

_registry: dict[str, StreamWorker] = {}
_registry_lock = threading.Lock()
_submit_lock = threading.Lock()


Job = Callable[[], Any]  # returns None, or a Flag to set once the worker has let go of the GIL


class StreamWorker:
    """A daemon thread that runs submitted jobs one after another, in submission order."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.thread: threading.Thread | None = None
        self._start()

    def _start(self) -> None:
        """A new thread, with a new flag and queue (in a forked child, the old ones may be
        mid-job or held by a thread that does not exist there)."""
        self._ready: Any = flag_type()()
        self._box: collections.deque[Job] = collections.deque()
        name = f"airstream-stream-{self.label}"
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        ready, box = self._ready, self._box
        kind = type(ready)
        then = None
        while True:
            if then is None:
                ready.wait(SPIN_NS)
            elif type(then) is kind:
                ready.wait(SPIN_NS, then)  # sets `then` after letting go of the GIL
            else:  # a flag of the other kind (a runtime told to use locks): set it first
                then.set()
                ready.wait(SPIN_NS)
            ready.clear()
            then = None
            while box:
                if then is not None:  # another job is queued: no reason to wait for the GIL
                    then.set()
                job = box.popleft()
                then = job()  # jobs catch their own exceptions (see runtime.cpu)
                del job  # a finished call's job must not keep its tensors alive until the next

    def submit(self, job: Job) -> None:
        """Queue ``job``; prefer :func:`submit_all` for the jobs of one call."""
        if self.thread is None:  # forked: this process has no thread for it yet
            self._start()
        self._box.append(job)
        self._ready.set()


def worker_for(label: str) -> StreamWorker:
    """The process-wide worker of stream ``label`` (created on first use)."""
    worker = _registry.get(label)
    if worker is None:
        with _registry_lock:
            worker = _registry.get(label)
            if worker is None:
                worker = _registry[label] = StreamWorker(label)
    return worker


def submit_all(jobs: Sequence[tuple[StreamWorker, Job]]) -> None:
    """Queue the side-stream jobs of one call atomically with respect to other calls."""
    with _submit_lock:
        for worker, job in jobs:
            worker.submit(job)


def _after_fork_in_child() -> None:
    """In a forked child: fresh locks, and every worker without a thread until its next job."""
    global _registry_lock, _submit_lock
    _registry_lock = threading.Lock()
    _submit_lock = threading.Lock()
    for worker in _registry.values():
        worker.thread = None


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def worker_count() -> int:
    """How many stream workers exist in this process."""
    return len(_registry)
