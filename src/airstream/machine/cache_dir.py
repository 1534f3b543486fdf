"""airstream's cache directory: ``$AIRSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/airstream``,
else ``~/.cache/airstream`` (a blank variable counts as unset).

What lives there: ``handoff/<key>/`` (the CPU runtime's handoff extension,
:mod:`airstream.runtime.handoff`), ``dumps/`` (the manifests of numbered graph dumps,
:mod:`airstream.debug.dump`) and ``calibration.json`` (measured stream costs,
:mod:`airstream.machine.calibration`). Read at each call, so a test or a process that changes the
variables sees the new place.
"""

from __future__ import annotations

from pathlib import Path

from airstream.machine import environment

__all__ = ["cache_root"]


def cache_root() -> Path:
    """airstream's cache directory (not created here)."""
    root = environment.AIRSTREAM_CACHE_DIR.read()
    if root is not None:
        return Path(root)
    xdg = environment.XDG_CACHE_HOME.read()
    return (Path(xdg) if xdg is not None else Path.home() / ".cache") / "airstream"
