"""``airstream run``: a script run with airstream, and the process it runs in."""

from __future__ import annotations

import argparse
import sys

__all__ = ["relaunch_for_openmp", "run_script"]


def run_script(args: argparse.Namespace) -> int:
    """Run ``args.script`` with the TorchAir shims, then say what ran on which stream."""
    import runpy

    if not args.torchair:
        print("airstream run: only --torchair scripts are supported so far", file=sys.stderr)
        return 2
    from airstream.cli.run_report import WhereRan, where_ran
    from airstream.compat.torchair import install
    from airstream.runtime.trace import add_listener, remove_listener

    seen = WhereRan() if install() else None
    sys.argv = [args.script, *args.args]
    if seen is not None:
        add_listener(seen)
    try:
        runpy.run_path(args.script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            raise
    finally:
        if seen is not None:
            remove_listener(seen)
    if seen is not None:
        print(where_ran(seen), end="")
    return 0


def relaunch_for_openmp() -> None:
    """Start this command again with a short OpenMP spin if torch's OpenMP runtime read none.

    The runtime reads its idle policy when torch loads, before a script runs; a process that
    alternates multi-stream calls with its own torch work keeps more of the streams' speed with
    idle threads that spin briefly (see airstream.machine.openmp). ``import airstream`` sets the
    policy before torch loads (airstream.machine.launch), so this starts a second process only where
    something imported torch before airstream. Does not return when it relaunches."""
    import os

    from airstream.machine.openmp import launch_environment

    extra = launch_environment(dict(os.environ))
    if extra:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, **extra})
