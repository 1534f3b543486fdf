"""The module paths of the flat layout before the top level became folders: importing one gives
the module at its new path, with a DeprecationWarning naming it (``airstream.config`` is
``airstream.options.config``). Nothing in airstream imports an old path;
``tests/test_layers.py`` checks both."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["GONE", "MOVED", "install"]

# old path -> new path
MOVED: dict[str, str] = {
    "airstream.cache_dir": "airstream.machine.cache_dir",
    "airstream.cache_files": "airstream.caching.cache_files",
    "airstream.cache_key": "airstream.compiler.cache_key",
    "airstream.cached_graph": "airstream.compiler.cached_graph",
    "airstream.calibration": "airstream.machine.calibration",
    "airstream.compile_cache": "airstream.caching.compile_cache",
    "airstream.config": "airstream.options.config",
    "airstream.decisions": "airstream.compiler.decisions",
    "airstream.decompositions": "airstream.compiler.decompositions",
    "airstream.demo": "airstream.cli.demo",
    "airstream.devices": "airstream.graph.devices",
    "airstream.doctor": "airstream.cli.doctor",
    "airstream.effects": "airstream.graph.effects",
    "airstream.environment": "airstream.machine.environment",
    "airstream.finish": "airstream.compiler.finish",
    "airstream.foreign_ops": "airstream.graph.foreign_ops",
    "airstream.fused": "airstream.graph.fused",
    "airstream.fusion": "airstream.graph.fusion",
    "airstream.graph_cache": "airstream.compiler.graph_cache",
    "airstream.launch": "airstream.machine.launch",
    "airstream.layouts": "airstream.graph.layouts",
    "airstream.measuring": "airstream.compiler.measuring",
    "airstream.mode": "airstream.graph.mode",
    "airstream.nodes": "airstream.graph.nodes",
    "airstream.observers": "airstream.debug.observers",
    "airstream.openmp": "airstream.machine.openmp",
    "airstream.option_checks": "airstream.options.checks",
    "airstream.options": "airstream.options.schema",
    "airstream.pipeline": "airstream.compiler.pipeline",
    "airstream.placements": "airstream.graph.placements",
    "airstream.run_report": "airstream.cli.run_report",
    "airstream.streams": "airstream.graph.streams",
    "airstream.tracebacks": "airstream.compiler.tracebacks",
}

# Old paths that cannot resolve to a module: ``airstream.explain`` is the function now.
GONE: dict[str, str] = {
    "airstream.explain": (
        "airstream.explain is the function explain(model, *inputs); its module moved to "
        "airstream.cli.explain: import from there"
    ),
}


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module already at its new one."""

    def __init__(self, new: str) -> None:
        self._new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self._new}: import it from there",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self._new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module ran at its new path


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: asked only for names no other finder found."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in GONE:
            raise ModuleNotFoundError(GONE[fullname], name=fullname)
        new = MOVED.get(fullname)
        return None if new is None else importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Resolve the old paths from now on (once per process)."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
