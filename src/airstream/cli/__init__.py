"""The ``airstream`` command.

``parser.py`` declares its subcommands and their --help; each runs a function of ``commands.py``
(``demo.py``, ``explain.py``, ``doctor.py``, the benchmarks of ``benches.py``), ``selftest.py``
(the self-test suites and their reports) or ``run.py`` (a script run with airstream, reported by
``run_report.py``). ``explain.py`` is also the library's ``airstream.explain``. Those functions
import what they need when they run: building the parser loads no benchmark or self-test
module.

Layer: applications. May import: torch_internals, options, machine, graph, passes, runtime, debug,
compiler, backend, caching, compat, selftest, examples, bench, airstream.
"""

from __future__ import annotations

from collections.abc import Sequence

from airstream.cli.parser import build_parser
from airstream.cli.run import relaunch_for_openmp

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``airstream`` command; returns the exit status."""
    args = build_parser().parse_args(argv)
    if argv is None and args.command == "run":  # a process of its own: set its spin policy
        relaunch_for_openmp()
    return args.func(args)
