"""What a process started as ``airstream run`` sets before torch loads.

OpenMP reads its idle policy once, when torch loads its kernels, so ``airstream run`` must set
``GOMP_SPINCOUNT`` (:func:`airstream.machine.openmp.launch_environment`) before anything imports
torch. The ``airstream`` command's own modules live in this package, whose ``__init__`` imports
torch, so ``airstream/__init__.py`` calls :func:`prepare` first: in a process that is the ``run``
command it puts the variables into ``os.environ`` (which the OpenMP runtime then reads, and the
script's child processes inherit); in any other process it does nothing. One process, one
import of torch. This module and :mod:`airstream.machine.openmp` import nothing from torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from airstream.machine.openmp import installed_runtime, launch_environment

__all__ = ["is_run_command", "prepare"]

_SCRIPT_NAMES = ("airstream", "airstream.exe", "airstream-script.py")
_MODULES = ("airstream", "airstream.cli", "airstream.__main__")


def is_run_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` (``sys.orig_argv``: the interpreter first) starts ``airstream run``:
    the ``airstream`` script, ``python -m airstream`` or ``python -m airstream.cli``, with
    ``run`` as the subcommand."""
    args = list(argv[1:])
    while args and args[0].startswith("-") and args[0] != "-m":  # interpreter options
        args = args[2:] if args[0] in ("-X", "-W") else args[1:]
    if len(args) >= 3 and args[0] == "-m" and args[1] in _MODULES:
        return args[2] == "run"
    if len(args) >= 2 and os.path.basename(args[0]) in _SCRIPT_NAMES:
        return args[1] == "run"
    return False


def prepare(argv: Sequence[str] | None = None) -> dict[str, str]:
    """In the ``airstream run`` process, before torch is imported: add the launch environment
    to ``os.environ`` and return what was added (``{}`` anywhere else, or once torch is loaded,
    when it would be too late and the command starts the script again instead)."""
    argv = sys.orig_argv if argv is None else argv
    if "torch" in sys.modules or not is_run_command(argv):
        return {}
    extra = launch_environment(dict(os.environ), installed_runtime())
    os.environ.update(extra)
    return extra
