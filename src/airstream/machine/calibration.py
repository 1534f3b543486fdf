"""Stream costs measured on the machine that runs the model, cached per machine and torch.

Whether a second stream pays depends on the machine: on one VM two matrix multiplies on two
threads finish in 0.8 of the time they take one after the other, on another in the same time, and
a handoff to a worker costs 20 us on one and 110 us on the next. ``auto_streams`` decides with
these figures (:class:`MachineCosts`):

- ``dispatch_seconds``: one small op, dispatcher and Python included;
- ``bytes_per_second`` / ``flops_per_second``: a weight-streaming and a compute-bound matrix
  multiply at the process's intra-op threads;
- ``side_stream_seconds``: what one side stream adds to a call (handoff to its worker, join);
- ``thread_slowdown``: how much longer a matrix multiply takes on one intra-op thread than at the
  default intra-op threads (during a multi-stream call every stream, the caller's included, runs
  ``stream_config.threads_per_stream`` threads, one by default: a stream's matrix multiply gives
  up the other cores' threads even with nothing beside it);
- ``sync_seconds``: each further cross-stream wait;
- how much longer work takes beside another stream's, over its time alone at the default
  intra-op threads (1.0: they overlap perfectly; 2.0: two take as long as one after the other):
  ``overlap_slowdown`` for a matrix multiply beside another (they share the memory bandwidth),
  ``mixed_slowdown`` for one beside small ops (host work: dispatch, Python; 1.0 with a core for
  each, 2.0 on one core: from the usable cores), ``host_slowdown`` for small ops beside small
  ops (they share the GIL).

They are measured once (``airstream.bench.calibrate``, 5-10 s, in a child process, so a compile
in progress is not disturbed and the measurement sees a quiet process), at first use, and cached
in ``calibration.json`` under ``$AIRSTREAM_CACHE_DIR`` (default ``$XDG_CACHE_HOME/airstream``,
else ``~/.cache/airstream``), keyed by host, CPU, usable cores, intra-op threads, the OpenMP
settings and the torch version.
``AIRSTREAM_COSTS=nominal`` uses fixed nominal figures instead (reproducible decisions, as the test
suite does); ``airstream doctor`` shows the figures in force and ``airstream doctor
--recalibrate`` measures again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from airstream.machine import environment
from airstream.machine.cache_dir import cache_root
from airstream.machine.openmp import OPENMP_VARIABLES

__all__ = [
    "NOMINAL",
    "MachineCosts",
    "cache_path",
    "calibrate_for",
    "identity",
    "machine_costs",
    "measures_costs",
    "stored_costs",
]

_COSTS_ATTRIBUTE = "airstream_costs"  # on a pass that reads machine_costs(<its value>) when it runs


def measures_costs(graph_pass: Any, mode: str | None) -> None:
    """Mark ``graph_pass`` as one that calls ``machine_costs(mode)`` when it runs."""
    setattr(graph_pass, _COSTS_ATTRIBUTE, mode)


def calibrate_for(passes: Any) -> None:
    """Measure now (or read) the costs each of ``passes`` marked by :func:`measures_costs` will
    read: a compile cache's key, computed before the passes run, then holds the figures the
    passes decide with (a first process on a machine would otherwise save its graph under a key
    without them, which the next process, calibrated, misses)."""
    for graph_pass in passes:
        if hasattr(graph_pass, _COSTS_ATTRIBUTE):
            machine_costs(getattr(graph_pass, _COSTS_ATTRIBUTE))


@dataclass(frozen=True)
class MachineCosts:
    """What work and streams cost on one machine (seconds; see the module docstring)."""

    dispatch_seconds: float
    bytes_per_second: float
    flops_per_second: float
    side_stream_seconds: float
    sync_seconds: float
    overlap_slowdown: float
    mixed_slowdown: float
    host_slowdown: float
    source: str  # "nominal", or "measured <UTC time>"
    thread_slowdown: float = 1.0  # a matrix multiply on 1 intra-op thread over the default

    def with_stream_threads(self, threads: int, default: int) -> MachineCosts:
        """The figures for streams running ``threads`` intra-op threads each, where
        ``thread_slowdown`` was measured for one: 1.0 at the ``default`` threads, linear between."""
        if threads <= 1 or self.thread_slowdown <= 1.0:
            return self
        if threads >= default:
            return dataclasses.replace(self, thread_slowdown=1.0)
        share = (default - threads) / max(default - 1, 1)
        return dataclasses.replace(self, thread_slowdown=1.0 + (self.thread_slowdown - 1.0) * share)

    def summary(self) -> str:
        """One line: the figures in words."""
        return (
            f"{self.source}: handoff {self.side_stream_seconds * 1e6:.0f} us per side stream per "
            f"call, {self.sync_seconds * 1e6:.0f} us per wait, {self.dispatch_seconds * 1e6:.1f} "
            f"us per small op, {self.bytes_per_second / 1e9:.1f} GB/s, "
            f"{self.flops_per_second / 1e9:.0f} GFLOP/s; a matrix multiply on one intra-op "
            f"thread takes {self.thread_slowdown:.2f}x its time at the default threads; beside "
            "another stream a matrix "
            f"multiply takes {self.overlap_slowdown:.2f}x its time alone next to a matrix "
            f"multiply, {self.mixed_slowdown:.2f}x next to small ops, and small ops next to "
            f"small ops {self.host_slowdown:.2f}x"
        )


# Fixed figures of one CPU core and this runtime, for reproducible decisions (the test suite).
NOMINAL = MachineCosts(
    dispatch_seconds=3e-6,
    bytes_per_second=8e9,
    flops_per_second=40e9,
    side_stream_seconds=80e-6,
    sync_seconds=30e-6,
    overlap_slowdown=1.0,
    mixed_slowdown=1.0,
    host_slowdown=1.0,
    source="nominal",
    thread_slowdown=1.0,
)

# What is measured: a new figure changes the cache key, so older entries are measured again.
FIGURES_VERSION = 2

_memo: dict[str, MachineCosts] = {}
_memo_lock = threading.Lock()
_warned: set[str] = set()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def identity(threads: int | None = None) -> dict[str, Any]:
    """What the figures depend on: the cache key's contents."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "host": platform.node(),
        "cpu": _cpu_model(),
        "usable_cores": usable,
        "intra_op_threads": threads if threads is not None else torch.get_num_threads(),
        "torch": torch.__version__,
        "openmp": {name: os.environ.get(name, "") for name in OPENMP_VARIABLES},
        "figures": FIGURES_VERSION,
    }


def _key(ident: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cache_path() -> Path:
    """Where measured figures are kept."""
    return cache_root() / "calibration.json"


def stored_costs() -> MachineCosts | None:
    """The measured figures stored for this machine and this thread's intra-op thread count (what
    ``machine_costs("measured")`` would return without measuring), or None."""
    return _load(_key(identity()))


def _load(key: str) -> MachineCosts | None:
    try:
        entry = json.loads(cache_path().read_text())[key]["costs"]
        return MachineCosts(**entry)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(key: str, ident: dict[str, Any], costs: MachineCosts) -> None:
    path = cache_path()
    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = {"identity": ident, "costs": dataclasses.asdict(costs)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: two processes calibrating at once never leave a torn file


def _measure_in_child(threads: int) -> MachineCosts:
    code = "import sys; from airstream.bench.calibrate import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "--threads", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the calibration process failed: {last}")
    return MachineCosts(**json.loads(done.stdout.strip().splitlines()[-1]))


def machine_costs(mode: str | None = None, *, recalibrate: bool = False) -> MachineCosts:
    """The figures ``auto_streams`` uses: ``mode`` ``"nominal"`` or ``"measured"`` (default:
    ``$AIRSTREAM_COSTS``, else ``"measured"``). Measured figures come from the cache, or are
    measured now and cached; if measuring fails, nominal figures are used with one warning."""
    mode = mode or environment.AIRSTREAM_COSTS.read()
    if mode == "nominal":
        return NOMINAL
    if mode != "measured":
        raise ValueError(f"airstream: costs must be 'measured' or 'nominal', got {mode!r}")
    threads = torch.get_num_threads()
    ident = identity(threads)
    key = _key(ident)
    with _memo_lock:
        if not recalibrate:
            known = _memo.get(key) or _load(key)
            if known is not None:
                _memo[key] = known
                return known
        with _machine_lock():  # one process measures; the others wait, then read its figures
            if not recalibrate:
                known = _load(key)
                if known is not None:
                    _memo[key] = known
                    return known
            return _measure_and_store(key, ident, threads)


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Held while measuring, across processes (ranks of one torchrun all compiling at once would
    otherwise measure side by side, each seeing the others' load)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): measure without it
        yield
        return
    path = cache_path().with_suffix(".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")
    except OSError:
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _measure_and_store(key: str, ident: dict[str, Any], threads: int) -> MachineCosts:
    """Measure in a child process and cache; nominal figures (one warning) if that fails."""
    try:
        costs = _measure_in_child(threads)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
        if key not in _warned:
            _warned.add(key)
            warnings.warn(
                f"airstream: could not measure stream costs on this machine ({error}); "
                "auto_streams decides with nominal figures. Run `airstream doctor "
                "--recalibrate` to see why, or set AIRSTREAM_COSTS=nominal to silence this.",
                stacklevel=3,
            )
        return NOMINAL
    try:
        _store(key, ident, costs)
    except OSError as error:
        warnings.warn(
            f"airstream: could not cache the measured stream costs at {cache_path()} "
            f"({error}); they will be measured again in the next process",
            stacklevel=3,
        )
    _memo[key] = costs
    return costs
