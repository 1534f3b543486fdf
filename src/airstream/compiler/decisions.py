"""measure_placement's decisions kept on disk, so a later process measures nothing it measured
before: ``<cache dir>/decisions/<graph key>/<range key>.json`` (``$AIRSTREAM_DECISIONS``:
``disk``, the default, or ``off``).

A graph's key is everything its measurement depends on: the graph as placed (each node, its
stream and each input's shape and dtype), its kind and mode, the measuring options (calls,
min_gain, ranges), the threads per stream, the machine (``calibration.identity``: host, CPU,
usable cores, intra-op threads, OpenMP variables) and its measured stream costs, and torch's,
airstream's and Python's versions. Each size range's decision is a file of its own, written
whole and renamed into place, so processes deciding different ranges at once never collide.
``airstream cache`` lists them; ``airstream explain`` shows a graph's.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from airstream.compiler.cache_key import airstream_version, calibration_digest, digest
from airstream.graph.nodes import source_line
from airstream.machine import calibration, environment
from airstream.machine.cache_dir import cache_root
from airstream.options.config import CompilerConfig
from airstream.runtime.measured import Measurement

__all__ = [
    "DecisionStore",
    "StoredGraph",
    "clear_decisions",
    "decision_store",
    "decisions_root",
    "list_decisions",
]

_GRAPH_FILE = "graph.json"


def decisions_root() -> Path:
    """Where decisions are kept (not created here)."""
    return cache_root() / "decisions"


def _input(node: torch.fx.Node) -> str:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__ if not isinstance(value, torch.SymInt) else f"Sym({value})"


def _graph_text(gm: torch.fx.GraphModule, stream_key: str) -> list[str]:
    """Each node as FX formats it, with its stream (and each input's shape and dtype)."""
    lines = []
    for node in gm.graph.nodes:
        extra = _input(node) if node.op == "placeholder" else node.meta.get(stream_key)
        lines.append(f"{node.format_node()} @ {extra}")
    return lines


def _fields(
    gm: torch.fx.GraphModule, config: CompilerConfig, kind: str, mode: str, stream_key: str
) -> dict[str, Any]:
    options = config.stream_config
    return {
        "graph": digest(_graph_text(gm, stream_key)),
        "kind": kind,
        "mode": mode,
        "measuring": [
            options.measure_calls,
            options.measure_min_gain,
            options.measure_ranges,
            options.measure_threads,
        ],
        "threads_per_stream": options.threads_per_stream,
        "machine": calibration.identity(),
        "costs": calibration_digest(),
        "torch": torch.__version__,
        "airstream": airstream_version(),
        "python": platform.python_version(),
    }


def _describe(gm: torch.fx.GraphModule, kind: str, mode: str, stream_key: str) -> str:
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    streams = sorted({str(n.meta.get(stream_key) or "main") for n in calls})
    lines = [line for line in map(source_line, calls) if line is not None]
    source = f", from {lines[0].split(' `')[0]}" if lines else ""
    return f"{kind} graph of {len(calls)} calls on streams {', '.join(streams)} ({mode}){source}"


@dataclass(frozen=True)
class DecisionStore:
    """One graph's decisions on disk, a file per size range."""

    directory: Path
    graph: str  # what the graph is, in words

    def load(self) -> dict[str, Measurement]:
        """Every range decided before, by range (unreadable files are skipped)."""
        found: dict[str, Measurement] = {}
        for path in sorted(self.directory.glob("range-*.json")):
            try:
                measurement = Measurement.from_dict(json.loads(path.read_text())["decision"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            found[measurement.size_range] = measurement
        return found

    def save(self, measurement: Measurement) -> None:
        """Keep one range's decision; a failure to write costs the next process a measurement,
        said once in a warning."""
        path = self.directory / f"range-{digest(measurement.size_range)[:16]}.json"
        entry = {"decision": measurement.as_dict(), "decided": time.time()}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            graph_file = self.directory / _GRAPH_FILE
            if not graph_file.exists():
                _write(graph_file, {"graph": self.graph})
            _write(path, entry)
        except OSError as error:
            warnings.warn(
                f"airstream: could not keep a measured stream decision at {path} ({error}); "
                "the next process measures it again (AIRSTREAM_DECISIONS=off stops trying)",
                RuntimeWarning,
                stacklevel=2,
            )


def _write(path: Path, value: Any) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=1))  # in order: the candidates as measured
    tmp.replace(path)  # whole or not at all: a reader never sees half a file


def decision_store(
    gm: torch.fx.GraphModule, config: CompilerConfig, kind: str, mode: str, stream_key: str
) -> DecisionStore | None:
    """The store of a graph about to be measured (placed, not yet fused), or None where
    ``$AIRSTREAM_DECISIONS`` is ``off``."""
    if environment.AIRSTREAM_DECISIONS.read() == "off":
        return None
    key = digest(_fields(gm, config, kind, mode, stream_key))[:32]
    return DecisionStore(decisions_root() / key, _describe(gm, kind, mode, stream_key))


@dataclass(frozen=True)
class StoredGraph:
    """A graph's stored decisions, as ``airstream cache`` lists them."""

    directory: Path
    graph: str
    decisions: tuple[Measurement, ...]
    modified: float
    bytes: int


def list_decisions(root: Path | None = None) -> list[StoredGraph]:
    """Every graph with stored decisions under ``root`` (default :func:`decisions_root`),
    newest first."""
    root = decisions_root() if root is None else root
    found = []
    for directory in root.glob("*/") if root.is_dir() else ():
        files = [p for p in directory.iterdir() if p.is_file()]
        try:
            graph = json.loads((directory / _GRAPH_FILE).read_text())["graph"]
        except (OSError, ValueError, KeyError, TypeError):
            graph = "(unknown graph)"
        decisions = tuple(DecisionStore(directory, graph).load().values())
        modified = max((p.stat().st_mtime for p in files), default=0.0)
        found.append(
            StoredGraph(directory, graph, decisions, modified, sum(p.stat().st_size for p in files))
        )
    return sorted(found, key=lambda g: -g.modified)


def clear_decisions(root: Path | None = None) -> tuple[int, int]:
    """Delete every stored decision; returns (graphs, bytes) removed."""
    graphs = list_decisions(root)
    for graph in graphs:
        shutil.rmtree(graph.directory, ignore_errors=True)
    return len(graphs), sum(g.bytes for g in graphs)
