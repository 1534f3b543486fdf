"""Spin-then-sleep flags for the CPU runtime's handoffs: a small C extension built on first use.

A handoff between two Python threads costs two sleeps and wake-ups of a thread (the worker
waiting for its job, the caller waiting at the join), tens of microseconds each on a VM. A
:class:`Flag` waits without the GIL: it spins on an atomic for a bounded time (a thread that is
about to be handed work finds it at once), then sleeps on a condition variable. ``wait(spin_ns,
then)`` sets ``then`` after releasing the GIL, so a worker can signal the end of its job at the
moment the caller can take the GIL without waiting for it.

:func:`team_runner` goes further where torch runs on GNU OpenMP: the call's streams run on the
caller's own OpenMP team, one stream per thread, in one parallel region. Those are the threads
torch's own parallel ops just used, still spinning for the next region: no thread is woken and
none competes with them for a core. A team thread keeps a Python thread state for its lifetime.

The extension (``handoff.c``: C against Python's headers, no torch; OpenMP's entry points are
found at run time in the library torch loaded) is compiled once per Python build into
airstream's cache directory with the C compiler Python was built with. Where that fails (with
one warning), or ``AIRSTREAM_HANDOFF=locks`` is set, :func:`flag_type` is :class:`LockFlag`: the
same interface on a plain lock, whose waiter sleeps at once and holds the GIL to wake up; the
runtime has one path for both. ``AIRSTREAM_HANDOFF=threads`` keeps side streams on worker
threads with spinning flags.

A forked child never runs a team: GNU OpenMP's pool there still lists the parent's threads, so a
region would wait for threads that do not exist (torch's own parallel ops hang there the same
way, which is why DataLoader's workers run one intra-op thread). Its calls take worker threads.
"""

from __future__ import annotations

import _thread
import functools
import hashlib
import os
import subprocess
import sys
import sysconfig
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airstream.machine import environment
from airstream.machine.cache_dir import cache_root
from airstream.machine.openmp import forked_child, openmp
from airstream.runtime import extension

__all__ = ["SPIN_NS", "LockFlag", "TeamRunner", "describe", "flag_type", "spins", "team_runner"]

# How long a waiter spins before it sleeps: longer than a handoff takes when both threads are
# running, short enough that an idle worker gives its core back to the caller's own torch work.
SPIN_NS = 50_000

_SOURCE_FILE = Path(__file__).with_name("handoff.c")


def _cache_dir() -> Path:
    """airstream's cache directory (:func:`airstream.machine.cache_dir.cache_root`)."""
    return cache_root()


def _choice() -> str:
    """``AIRSTREAM_HANDOFF``: ``auto``, ``threads`` or ``locks`` (checked)."""
    return environment.AIRSTREAM_HANDOFF.read()


def _after_fork_in_child() -> None:
    if _extension.cache_info().currsize:  # loaded: its run_team must stop forming teams
        module = _extension()
        if module is not None:
            module.after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


@functools.cache
def _extension() -> Any:
    """The extension module, built on first use; ``None`` where it cannot be built or
    ``AIRSTREAM_HANDOFF=locks`` is set (warned once)."""
    if _choice() == "locks":
        return None
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    key = hashlib.sha1((_SOURCE_FILE.read_text() + sys.version).encode()).hexdigest()[:12]
    target = _cache_dir() / "handoff" / key / f"airstream_handoff{suffix}"
    try:
        if not target.exists():
            extension.build(_SOURCE_FILE, target, "CC", ["-O2"], ["-lpthread", "-ldl"])
        module = extension.load("airstream_handoff", target)
        if forked_child():  # loaded first in a forked child
            module.after_fork()
        return module
    except (OSError, ImportError, subprocess.SubprocessError) as error:
        warnings.warn(
            f"airstream: the CPU runtime's spinning handoff is unavailable ({error}); side "
            "streams hand off with locks (tens of microseconds more per call). It needs the C "
            "compiler Python was built with and Python's headers (python3-dev).",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


class LockFlag:
    """The extension's ``Flag`` on a plain lock, held while the flag is clear: ``set`` releases
    it, ``wait`` takes it and gives it back (so every waiter passes), ``clear`` takes it again.
    Setting a set flag is no error (a failed call sets every event, and a stream still running
    may record one of them again)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # set already
            pass

    def clear(self) -> None:
        """Clear a set flag (called where no thread waits for it)."""
        self._lock.acquire(False)

    def is_set(self) -> bool:
        return not self._lock.locked()

    def wait(self, spin_ns: int = 0, then: Any = None) -> None:
        """Return once the flag is set; set ``then`` first (the GIL is held here throughout, so
        there is no later moment that would let its waiter run sooner)."""
        if then is not None:
            then.set()
        self._lock.acquire()
        self.set()


def flag_type() -> Any:
    """The ``Flag`` class: the extension's spinning flag, built on first use; :class:`LockFlag`
    where it cannot be built (warned once) or ``AIRSTREAM_HANDOFF=locks`` is set."""
    module = _extension()
    return LockFlag if module is None else module.Flag


def spins() -> bool:
    """Whether this process's flags spin without the GIL (the extension is in use)."""
    return _extension() is not None


TeamRunner = Callable[[tuple[Callable[[], Any], ...]], "tuple[Any] | None"]


@functools.cache
def team_runner() -> TeamRunner | None:
    """``run_team(fns)``: call ``fns[0]`` on the calling thread and ``fns[i]`` on thread ``i`` of
    its OpenMP team, all at once; ``(fns[0]'s result,)``, or ``None`` (nothing ran) where no team
    of ``len(fns)`` threads could be formed (inside a parallel region, a capped team).

    Available where torch runs on GNU OpenMP, whose entry points the extension binds to in the
    library torch loaded, and the extension is built; ``None`` otherwise, and where
    ``AIRSTREAM_HANDOFF`` is ``threads`` or ``locks``."""
    if _choice() in ("threads", "locks"):
        return None
    info = openmp()
    module = _extension()
    if module is None or info.runtime != "GNU OpenMP" or info.library is None:
        return None
    return module.run_team if module.bind(info.library) else None


def describe() -> str:
    """How side streams are handed their work in this process, in words."""
    if team_runner() is not None:
        return (
            "on the caller's OpenMP team where streams run 1 intra-op thread each (the "
            "default), else on worker threads with spinning flags"
        )
    if spins():
        return "on worker threads with spinning flags (no OpenMP team: not GNU OpenMP, or chosen)"
    return "on worker threads with locks (the handoff extension is unavailable, or chosen)"
