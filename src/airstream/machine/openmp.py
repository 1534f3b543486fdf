"""The OpenMP runtime torch's CPU kernels run on, and sending its idle threads away.

After every parallel region, an OpenMP runtime's worker threads wait for the next one by spinning:
GNU OpenMP for ``GOMP_SPINCOUNT`` iterations (300,000 by default, milliseconds on a slow core),
Intel's and LLVM's for ``KMP_BLOCKTIME`` (200 ms). A process that runs ordinary multi-threaded
torch work and then a multi-stream call hands that call cores already taken by spinning threads,
and the side streams' worker threads queue behind them. The variables that shorten the spin are
read once, when the runtime loads (``import torch``), so a library cannot set them later.

What a library can do is OpenMP 5.0's ``omp_pause_resource_all(omp_pause_soft)``: the calling
thread's idle team is released (GNU OpenMP ends those threads, LLVM's put them to sleep) and the
next parallel region starts them again. :func:`release_idle_threads` does that for the calling
thread; the CPU runtime calls it before each multi-stream call (``stream_config.
release_openmp_threads``) where the policy in force spins long (:attr:`OpenMP.spins_long`).
Where a process is started with a short spin (``GOMP_SPINCOUNT=10000``: ``airstream run`` sets
it), releasing costs more than it saves and is skipped. A spin throttled process-wide (100
iterations, what libgomp does when it manages more threads than CPUs) would cost eager code
1.4-2.3x on small parallel ops, so airstream never forces one. All knowledge of OpenMP runtimes
lives here.

In a forked child nothing is released: GNU OpenMP's pool there still lists the parent's team
threads, and releasing them waits for threads that do not exist (as would any parallel region on
more than one thread: torch's own ops hang there too, which is why DataLoader's workers run one).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LAUNCH_SPINCOUNT",
    "OPENMP_VARIABLES",
    "OpenMP",
    "forked_child",
    "installed_runtime",
    "launch_environment",
    "openmp",
    "release_costs",
    "release_idle_threads",
    "set_intra_op_threads",
]

# The environment variables that set OpenMP's thread count and idle policy, read at load time.
OPENMP_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")

# Library file prefix -> (runtime, what its idle threads do by default).
_RUNTIMES = {
    "libgomp": ("GNU OpenMP", "idle threads spin GOMP_SPINCOUNT (300,000) iterations, then sleep"),
    "libiomp": ("Intel OpenMP", "idle threads spin KMP_BLOCKTIME (200 ms), then sleep"),
    "libomp": ("LLVM OpenMP", "idle threads spin KMP_BLOCKTIME (200 ms), then sleep"),
    "vcomp": ("MSVC OpenMP", "runtime default"),
}
_OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: omp_pause_soft

# GNU OpenMP's default spin (GOMP_SPINCOUNT unset, OMP_WAIT_POLICY unset), and the longest spin
# after which a multi-stream call does not release the caller's team: measured on a 2-core VM
# (`airstream bench serving-loop`), at 10,000 spins the release's join costs more than the spin.
_GOMP_DEFAULT_SPINS = 300_000
_SHORT_SPINS = 10_000
# What `airstream run` sets where nothing is set: idle threads spin about 10,000 iterations
# (tens of microseconds) instead of 300,000; eager work measured unchanged within noise.
LAUNCH_SPINCOUNT = "10000"


@dataclass(frozen=True)
class OpenMP:
    """The OpenMP runtime loaded in this process: ``runtime`` (a name, ``"unknown"`` if none was
    found), ``library`` (its file, or ``None``), ``idle`` (what its idle threads do by default),
    ``can_release`` (whether :func:`release_idle_threads` acts), ``policy`` (the idle policy in
    force, in words) and ``spins_long`` (whether idle threads spin long enough to take the cores
    of a multi-stream call that follows the caller's own torch work)."""

    runtime: str
    library: str | None
    idle: str
    can_release: bool
    policy: str
    spins_long: bool


def _loaded_library() -> str | None:
    """The path of the OpenMP library in this process (Linux: /proc/self/maps), preferring the
    one shipped inside torch when several are loaded."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "omp" in line and "/" in line}
    except OSError:
        return None
    found = sorted(
        (p for p in paths if any(os.path.basename(p).startswith(r) for r in _RUNTIMES)),
        key=lambda p: (f"{os.sep}torch{os.sep}" not in p, p),
    )
    return found[0] if found else None


_forked = False  # this process is a forked child (set by the at-fork handler below)


def _after_fork_in_child() -> None:
    global _forked
    _forked = True
    _pause.cache_clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forked_child() -> bool:
    """Whether this process is a forked child, where GNU OpenMP's pool lists threads it lacks."""
    return _forked


@functools.cache
def _pause() -> Any:
    if _forked:
        return None
    path = _loaded_library()
    if path is None:
        return None
    try:
        function = ctypes.CDLL(path).omp_pause_resource_all  # OpenMP >= 5.0
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def _spins(value: str) -> int | None:
    """A GOMP_SPINCOUNT value as spins (``infinite`` is very many), None if unreadable."""
    value = value.strip().lower()
    if value in ("infinite", "infinity"):
        return 1 << 62
    scale = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(value[-1:], 1)
    digits = value[:-1] if scale > 1 else value
    return int(digits) * scale if digits.isdigit() else None


def _policy(runtime: str, env: dict[str, str]) -> tuple[str, bool]:
    """The idle policy the runtime read at load time, in words, and whether it spins long."""
    wait = env.get("OMP_WAIT_POLICY", "").strip().lower()
    if wait == "passive":
        return "OMP_WAIT_POLICY=PASSIVE: idle threads sleep at once", False
    if runtime == "GNU OpenMP":
        if "GOMP_SPINCOUNT" in env and _spins(env["GOMP_SPINCOUNT"]) is not None:
            spins = _spins(env["GOMP_SPINCOUNT"]) or 0
            source = f"GOMP_SPINCOUNT={env['GOMP_SPINCOUNT']}"
        elif wait == "active":
            spins, source = 1 << 62, "OMP_WAIT_POLICY=ACTIVE"
        else:
            spins, source = _GOMP_DEFAULT_SPINS, "the default (GOMP_SPINCOUNT unset)"
        amount = "without end" if spins >= 1 << 40 else f"{spins:,} iterations"
        return f"idle threads spin {amount}, {source}", spins > _SHORT_SPINS
    if runtime in ("Intel OpenMP", "LLVM OpenMP"):
        blocktime = env.get("KMP_BLOCKTIME", "").strip().lower()
        if blocktime.isdigit():
            return f"idle threads spin {blocktime} ms (KMP_BLOCKTIME)", int(blocktime) > 1
        return "idle threads spin 200 ms, the default (KMP_BLOCKTIME unset)", True
    return "unknown", False


@functools.cache
def openmp() -> OpenMP:
    """Which OpenMP runtime torch runs on here and what its idle threads do (the environment
    as this process started: the runtime read it when torch loaded)."""
    path = _loaded_library()
    name = os.path.basename(path) if path else ""
    runtime, idle = next(
        (found for prefix, found in _RUNTIMES.items() if name.startswith(prefix)),
        ("unknown", "runtime default"),
    )
    policy, spins_long = _policy(runtime, dict(os.environ))
    return OpenMP(runtime, path, idle, _pause() is not None, policy, spins_long)


def installed_runtime() -> str:
    """The OpenMP runtime the installed torch ships beside its libraries, found without
    importing torch (for a process that must set OpenMP's variables before torch loads them);
    ``"unknown"`` where torch links one from elsewhere (a system or conda library)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "unknown"
    root = next(iter(spec.submodule_search_locations))
    for folder in (os.path.join(root, "lib"), os.path.join(os.path.dirname(root), "torch.libs")):
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
        for prefix, (runtime, _) in _RUNTIMES.items():
            if any(name.startswith(prefix) for name in names):
                return runtime
    return "unknown"


def launch_environment(env: dict[str, str], runtime: str | None = None) -> dict[str, str]:
    """The variables to add to ``env`` for a process airstream starts, so that its idle OpenMP
    threads spin briefly: ``GOMP_SPINCOUNT`` where GNU OpenMP is in use (``runtime``; default:
    the one loaded in this process) or the runtime is unknown (other runtimes ignore it), and no
    idle policy is set; nothing otherwise (a policy the user set is kept)."""
    if (openmp().runtime if runtime is None else runtime) not in ("GNU OpenMP", "unknown"):
        return {}
    if any(name in env for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")):
        return {}
    return {"GOMP_SPINCOUNT": LAUNCH_SPINCOUNT}


@functools.cache
def _set_num_threads() -> Any:
    path = _loaded_library()
    if path is None:
        return None
    try:
        function = ctypes.CDLL(path).omp_set_num_threads
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = None
    return function


def set_intra_op_threads(threads: int) -> None:
    """Run the calling thread's torch ops on ``threads`` intra-op threads, and no other
    thread's.

    ``torch.set_num_threads`` also stores the count every thread adopts at its first torch op,
    so a temporary change on one thread (a stream's worker, a caller running the main stream)
    leaks into threads started meanwhile, and a caller that started then keeps one thread for
    good. OpenMP's own ``omp_set_num_threads`` changes the calling thread alone; ATen's
    parallel ops and MKL follow it. Where torch's OpenMP runtime cannot be found (a build
    without OpenMP), this is ``torch.set_num_threads``."""
    import torch  # called at run time, torch loaded; this module must import without it

    if torch.get_num_threads() == threads:  # also torch's first-use setup of this thread,
        return  # which would overwrite a count set before it
    setter = _set_num_threads()
    if setter is None:
        torch.set_num_threads(threads)
    else:
        setter(threads)


def release_idle_threads() -> None:
    """Release the calling thread's idle OpenMP team so that no thread of it spins on a core.

    Costs well under a microsecond when the thread has no team; otherwise the next parallel
    region on this thread starts its threads again (tens of microseconds each). A no-op where
    the runtime lacks ``omp_pause_resource_all`` or cannot be found."""
    pause = _pause()
    if pause is not None:
        pause(_OMP_PAUSE_SOFT)


def release_costs(repeat: int = 30) -> dict[str, float]:
    """What releasing costs here, in microseconds (medians of ``repeat``): ``release``, right
    after a parallel op (the team is still spinning: what a multi-stream call after the caller's
    own torch work pays) and ``restart``, the extra time of the next parallel op (the team
    started again: what the caller's next torch work pays). Empty where nothing is released."""
    if _pause() is None:
        return {}
    import statistics
    import time

    import torch

    x = torch.ones(1 << 20)
    release, first, again = [], [], []
    for _ in range(repeat):
        torch.add(x, x)
        start = time.perf_counter()
        release_idle_threads()
        middle = time.perf_counter()
        torch.add(x, x)
        end = time.perf_counter()
        torch.add(x, x)
        release.append(middle - start)
        first.append(end - middle)
        again.append(time.perf_counter() - end)
    return {
        "release": statistics.median(release) * 1e6,
        "restart": max(0.0, (statistics.median(first) - statistics.median(again)) * 1e6),
    }
