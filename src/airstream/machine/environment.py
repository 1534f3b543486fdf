"""Every environment variable airstream reads: one table, one accessor that checks the value.

Each :class:`Variable` declares a name, the values it takes, its default (in force where it is
unset or blank), what it does and who reads it; ``Variable.read()`` returns the value now (read
at each call, as every reader did before) and raises :class:`~airstream.errors.ConfigError`
naming the variable and its allowed values for any other value (``AIRSTREAM_COSTS=bogus``).
Words (``AIRSTREAM_HANDOFF``, ``AIRSTREAM_COSTS``) are compared stripped and in lower case.
Variables owned by torch are read as torch reads them and never rejected: airstream must not
refuse a value torch accepts.

Not here: the OpenMP variables (:data:`OPENMP`, by reference), which the OpenMP runtime reads
when torch loads; :mod:`airstream.machine.openmp` handles them and must stay importable before
torch. Nor the variables airstream *sets* for child processes (``MASTER_ADDR`` in ``bench/tp.py``,
``GOMP_SPINCOUNT`` by ``airstream run``): those are not reads.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from airstream.errors import ConfigError
from airstream.machine.openmp import OPENMP_VARIABLES
from airstream.options.checks import Invalid, choice

__all__ = [
    "AIRSTREAM_CACHE_DIR",
    "AIRSTREAM_COSTS",
    "AIRSTREAM_DECISIONS",
    "AIRSTREAM_HANDOFF",
    "AIRSTREAM_KERNEL_GIL",
    "AIRSTREAM_MODE",
    "OPENMP",
    "TORCHAIR_CACHE_HOME",
    "TORCHDYNAMO_VERBOSE",
    "TORCH_COMPILE_DEBUG",
    "VARIABLES",
    "XDG_CACHE_HOME",
    "Variable",
    "read",
]

T = TypeVar("T")


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One environment variable: ``allowed`` (its values, in words), ``default`` (in force
    where it is unset or blank), ``doc``, ``readers`` (the functions that read it), ``owner``
    (who defines it) and ``check(name, text)`` (the value to use, or :class:`Invalid`)."""

    name: str
    allowed: str
    default: T
    doc: str
    readers: tuple[str, ...]
    check: Callable[[str, str], T]
    owner: str = "airstream"

    def read(self) -> T:
        """The value in the environment now, checked; ``default`` where unset or blank."""
        text = os.environ.get(self.name, "")
        if not text.strip():
            return self.default
        try:
            return self.check(self.name, text)
        except Invalid as e:
            raise ConfigError(
                f"invalid value {text!r} for environment variable {self.name}; allowed values: "
                f"{e} (unset: {self.default!r}). {self.name}: {self.doc}"
            ) from None


def _word(*allowed: str) -> Callable[[str, str], str]:
    """One of ``allowed``, compared stripped and in lower case."""
    exact = choice(*allowed)

    def check(name: str, text: str) -> str:
        return str(exact(name, text.strip().lower()))

    return check


def _path(name: str, text: str) -> str | None:
    """A path, as given."""
    return text


def _is_one(name: str, text: str) -> bool:
    """On for ``"1"``, off for anything else (how torch reads its flags)."""
    return text == "1"


AIRSTREAM_CACHE_DIR: Variable[str | None] = Variable(
    "AIRSTREAM_CACHE_DIR",
    "a directory path",
    None,
    "airstream's cache directory (cache_compile's entries in compiled/, the handoff "
    "extension, graph-dump manifests, calibration.json); unset: $XDG_CACHE_HOME/airstream, "
    "else ~/.cache/airstream",
    ("airstream.machine.cache_dir.cache_root",),
    _path,
)
XDG_CACHE_HOME: Variable[str | None] = Variable(
    "XDG_CACHE_HOME",
    "a directory path",
    None,
    "the user's cache directory; airstream's cache is its airstream/ folder where "
    "AIRSTREAM_CACHE_DIR is unset (unset: ~/.cache)",
    ("airstream.machine.cache_dir.cache_root",),
    _path,
    owner="XDG Base Directory specification",
)
AIRSTREAM_HANDOFF: Variable[str] = Variable(
    "AIRSTREAM_HANDOFF",
    "'auto', 'threads', 'locks'",
    "auto",
    "how the CPU runtime hands side streams their work: auto = on the caller's OpenMP team "
    "where torch runs on GNU OpenMP, else worker threads with spinning flags, else locks; "
    "threads = worker threads with flags; locks = worker threads with locks",
    ("airstream.runtime.handoff._choice",),
    _word("auto", "threads", "locks"),
)
AIRSTREAM_KERNEL_GIL: Variable[str] = Variable(
    "AIRSTREAM_KERNEL_GIL",
    "'release', 'hold'",
    "release",
    "whether the CPU kernels of airstream's Inductor segments let go of the GIL while they "
    "run: release = as ATen's ops do, so kernels of different streams run at once; hold = as "
    "Inductor binds them, one at a time (to measure what releasing gains, or to rule it out); "
    "read as a graph's segments compile; a kernel loaded once in a process stays as it loaded",
    ("airstream.schedule.fuse.compile_segments",),
    _word("release", "hold"),
)
AIRSTREAM_DECISIONS: Variable[str] = Variable(
    "AIRSTREAM_DECISIONS",
    "'disk', 'off'",
    "disk",
    "where measure_placement's decisions live: disk = in airstream's cache directory "
    "(decisions/), keyed by the graph, its size range, the machine, the mode and the versions, "
    "so a later process measures nothing it measured before (`airstream cache` lists them); "
    "off = measured again in every process (the test suite sets it)",
    ("airstream.compiler.decisions.decision_store",),
    _word("disk", "off"),
)
AIRSTREAM_COSTS: Variable[str] = Variable(
    "AIRSTREAM_COSTS",
    "'measured', 'nominal'",
    "measured",
    "the stream costs auto_streams decides with: measured = measured on this machine once and "
    "cached; nominal = fixed figures (reproducible decisions; the test suite sets it)",
    (
        "airstream.machine.calibration.machine_costs",
        "airstream.bench.calibrate.costs_report (airstream doctor)",
    ),
    _word("measured", "nominal"),
)
TORCHAIR_CACHE_HOME: Variable[str | None] = Variable(
    "TORCHAIR_CACHE_HOME",
    "a directory path",
    None,
    "TorchAir's: where torchair.inference.cache_compile keeps its entries when given no "
    "cache_dir (unset: ./.torchair_cache)",
    ("airstream.compat.torchair.cache.CompiledModel.get_cache_bin",),
    _path,
)
AIRSTREAM_MODE: Variable[str | None] = Variable(
    "AIRSTREAM_MODE",
    "'reduce-overhead', 'max-autotune'",
    None,
    "the mode of every config that leaves `mode` at 'default' (unset: chosen per device, see "
    "airstream.graph.mode); reduce-overhead compiles in a fraction of the time (the test suite "
    "sets it)",
    ("airstream.graph.mode.resolve_mode",),
    _word("reduce-overhead", "max-autotune"),
)
TORCHDYNAMO_VERBOSE: Variable[bool] = Variable(
    "TORCHDYNAMO_VERBOSE",
    "'1' = on, anything else off (torch's reading)",
    False,
    "torch's flag for Dynamo's full tracebacks; airstream's compile errors then keep every "
    "frame, torch's and airstream's included",
    ("airstream.compiler.tracebacks.readable",),
    _is_one,
    owner="torch",
)
TORCH_COMPILE_DEBUG: Variable[bool] = Variable(
    "TORCH_COMPILE_DEBUG",
    "'1' = on, anything else off (TorchAir's reading)",
    False,
    "torch's compile-debug flag; at import, TorchAir's 'torchair' logger starts at DEBUG "
    "instead of ERROR",
    ("airstream.compat.torchair.logger",),
    _is_one,
    owner="torch (read as TorchAir reads it)",
)

VARIABLES: dict[str, Variable[Any]] = {
    v.name: v
    for v in (
        AIRSTREAM_CACHE_DIR,
        XDG_CACHE_HOME,
        AIRSTREAM_HANDOFF,
        AIRSTREAM_KERNEL_GIL,
        AIRSTREAM_COSTS,
        AIRSTREAM_DECISIONS,
        AIRSTREAM_MODE,
        TORCHAIR_CACHE_HOME,
        TORCHDYNAMO_VERBOSE,
        TORCH_COMPILE_DEBUG,
    )
}
"""The table: every variable airstream reads through :meth:`Variable.read`, by name."""

OPENMP: dict[str, str] = {
    name: "read by the OpenMP runtime when torch loads; see airstream.machine.openmp "
    "(OPENMP_VARIABLES), shown by airstream doctor and part of calibration.identity's cache key"
    for name in OPENMP_VARIABLES
}
"""The OpenMP variables, listed by reference: :mod:`airstream.machine.openmp` reads them as they
are."""


def read(name: str) -> Any:
    """``VARIABLES[name].read()``: the checked value of a declared variable."""
    variable = VARIABLES.get(name)
    if variable is None:
        raise KeyError(
            f"{name!r} is not an environment variable airstream declares; declared: "
            + ", ".join(VARIABLES)
        )
    return variable.read()
