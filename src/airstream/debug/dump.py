"""Graph dumps driven by ``debug.graph_dump.type`` and ``debug.graph_dump.path``.

One file per step, numbered so ``ls`` shows the order and named for the graph and the step::

    000_dynamo.txt
    001_inference_after_aot.txt
    002_inference_after_post_grad_custom_pre_pass.txt
    003_inference_after_builtin.txt
    004_inference_plan.txt
    005_inference_summary.txt          (stream allocation summary, every type)

With ``debug.graph_dump.naming = "torchair"`` (set by the TorchAir compat layer) the names are
TorchAir's and only its two graphs are written: ``dynamo_original_graph_<n>_rank_<r>_pid_<pid>_
ts_<utc>.<type>`` (the Dynamo graph) and ``dynamo_optimized_graph_<n>_...`` (the graph that runs,
with its plan); ``n`` counts the graphs of the process. A ``py`` dump is then the FX graph in
both files (the optimized one is the aten graph that runs, not the executor's code).

Types: ``txt`` (each node with its stream; the plan dump adds the steps and syncs), ``py`` (the
graph's code with each node's source line as a comment; the plan dump is the code the executor
runs), ``dot`` and ``svg`` (Graphviz; an
``svg`` request without Graphviz's ``dot`` on the machine writes the ``.dot`` and warns). On a
pass failure the graph from before the failing pass is written as ``NNN_<kind>_before_<pass>``.

Each run starts at ``000``: the first numbered dump a process writes into a directory deletes the
files the previous run wrote there, and only those. Chosen over a fresh folder per run so the
path stays the one configured (and documented) while a rerun never leaves stale graphs beside
new ones. A manifest in airstream's cache (the writer's pid, the directory, each file it
wrote; see ``_manifest``) says which files are a run's own, so the directory holds only dumps;
other files are never deleted (numbering continues after any numbered file left there), nor
are a still-running process's (another rank dumping to the same directory). :func:`start_run`
starts over within one process. TorchAir naming deletes nothing: its names carry a timestamp.
Paths (``GraphDumper.written``, messages) are absolute.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import threading
import warnings
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import torch.fx

from airstream.debug.dot import to_dot
from airstream.debug.observers import CompileObserver
from airstream.debug.report import format_segments, format_streams
from airstream.errors import StreamError
from airstream.graph.streams import StreamAssignment, assign_streams
from airstream.machine.cache_dir import cache_root
from airstream.passes.manager import PassSpec
from airstream.schedule.plan import StreamPlan

__all__ = ["DumpObserver", "GraphDumper", "dump_observer", "dumper_for", "start_run"]


_numbers: dict[str, itertools.count[int]] = {}
_numbers_lock = threading.Lock()
_graph_ids = itertools.count()  # TorchAir naming: the process's Dynamo graphs, in order

_OWN_NAME = re.compile(r"\d{3,}_[A-Za-z0-9_]+\.(txt|py|dot|svg)")


def _alive(pid: int) -> bool:
    """Whether another process ``pid`` is running (it may still be writing its dumps)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _manifest(directory: str) -> str:
    """Where the run writing numbered dumps into ``directory`` lists them: the pid of the run,
    the directory, then each file's name. It lives in airstream's cache
    (``AIRSTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/airstream`` or ``~/.cache/airstream``), so
    the dump directory holds only dumps."""
    root = str(cache_root())
    key = hashlib.sha1(os.path.realpath(directory).encode()).hexdigest()[:20]
    return os.path.join(root, "dumps", f"{key}.txt")


@functools.cache  # once per process and cache folder
def _prune_manifests(folder: str) -> None:
    """Delete the manifests of dump directories that no longer exist (temporary ones)."""
    for entry in os.scandir(folder) if os.path.isdir(folder) else ():
        with contextlib.suppress(OSError):
            with open(entry.path) as f:
                lines = f.read().split("\n")
            if len(lines) > 1 and not os.path.isdir(lines[1]):
                os.remove(entry.path)


def _clear_previous_run(directory: str) -> None:
    """Delete the numbered files the manifest lists (those an earlier run wrote and nothing
    else), unless the run that wrote them is still going; start a fresh manifest. Without a
    manifest (or a writable cache) nothing is deleted and numbers continue after the files."""
    manifest = _manifest(directory)
    _prune_manifests(os.path.dirname(manifest))
    try:
        with open(manifest) as f:
            owner, _, *names = f.read().split("\n")
    except (OSError, ValueError):
        owner, names = "", []
    if owner.isdigit() and _alive(int(owner)):
        return  # a concurrent process (another rank) owns these files: number after them
    for name in names:
        path = os.path.join(directory, name)
        if _OWN_NAME.fullmatch(name) and os.path.isfile(path):
            os.remove(path)
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(manifest), exist_ok=True)
        with open(manifest, "w") as f:
            f.write(f"{os.getpid()}\n{os.path.realpath(directory)}\n")


def _note_written(directory: str, path: str) -> None:
    """Add a numbered file to the directory's manifest, so the next run can clear it."""
    with _numbers_lock, contextlib.suppress(OSError), open(_manifest(directory), "a") as f:
        f.write(os.path.basename(path) + "\n")


def start_run(directory: str) -> None:
    """Start a new run of numbered dumps in ``directory``: delete the files the previous run
    wrote there (listed in its manifest) and number from ``000`` again. The first dump into a
    directory in a process does this itself; call it to start over within one process."""
    directory = os.path.abspath(directory)
    with _numbers_lock:
        os.makedirs(directory, exist_ok=True)
        _clear_previous_run(directory)
        _numbers[directory] = _counter_after_existing(directory)


def _counter_after_existing(directory: str) -> itertools.count[int]:
    """Numbers after any numbered file left in ``directory`` (another run's, or not ours)."""
    existing = [
        int(m.group(1)) for name in os.listdir(directory) if (m := re.match(r"(\d+)_", name))
    ]
    return itertools.count(max(existing, default=-1) + 1)


def _next_number(directory: str) -> int:
    """Sequence numbers per directory, process-wide, so every backend and every Dynamo graph
    writing to one directory gets ordered, unique names; the process's first number there
    starts a run (:func:`start_run`)."""
    with _numbers_lock:
        counter = _numbers.get(directory)
        if counter is None:
            _clear_previous_run(directory)
            counter = _numbers[directory] = _counter_after_existing(directory)
        return next(counter)


@functools.cache  # one notice per process, however many dumps
def warn_no_graphviz() -> None:
    """Say once that svg dumps fall back to .dot files because Graphviz is missing."""
    warnings.warn(
        "airstream: debug.graph_dump.type='svg' needs Graphviz's `dot` program, which is not on "
        "PATH, so graph dumps are written as .dot files (this notice appears once). Install "
        "Graphviz for svg: apt-get install graphviz (Debian/Ubuntu) or brew install graphviz "
        "(macOS); `airstream doctor` lists every optional part.",
        stacklevel=4,
    )


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:80]


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


_TORCHAIR_NAMES = {"": "dynamo_original_graph", "plan": "dynamo_optimized_graph"}


class GraphDumper:
    """Writes numbered dumps of one backend's graphs into one directory (or, with ``naming``
    ``"torchair"``, TorchAir's two files per graph)."""

    def __init__(self, kind: str, path: str, naming: str = "numbered") -> None:
        self.kind = kind
        self.path = os.path.abspath(path)
        self.naming = naming
        self.written: list[str] = []
        self._graph_id = 0

    def _torchair_name(self, graph_kind: str, step: str, ext: str) -> str | None:
        if graph_kind == "dynamo":
            self._graph_id = next(_graph_ids)
        base = _TORCHAIR_NAMES.get(step)
        if base is None:
            if not step.startswith("before_"):
                return None  # TorchAir writes no intermediate graphs
            base = f"dynamo_{graph_kind}_graph_{step}"  # a failed pass: the graph before it
        stamp = datetime.now(tz=UTC).strftime("%Y%m%d%H%M%S%f")
        name = f"{base}_{self._graph_id}_rank_{_rank()}_pid_{os.getpid()}_ts_{stamp}.{ext}"
        return os.path.join(self.path, name)

    def _next(self, graph_kind: str, step: str, ext: str) -> str | None:
        os.makedirs(self.path, exist_ok=True)
        if self.naming == "torchair":
            return self._torchair_name(graph_kind, step, ext)
        number = _next_number(self.path)
        name = f"{number:03d}_{graph_kind}_{step}" if step else f"{number:03d}_{graph_kind}"
        return os.path.join(self.path, f"{name}.{ext}")

    def _write(self, path: str, text: str) -> str:
        with open(path, "w") as f:
            f.write(text)
        self.written.append(path)
        if self.naming != "torchair":
            _note_written(self.path, path)
        return path

    def _render(
        self,
        gm: torch.fx.GraphModule,
        streams: StreamAssignment | None,
        plan: StreamPlan | None,
        code: str | None,
        title: str,
    ) -> str:
        if self.kind == "txt":
            text = f"# {title}\n"
            if streams is None:
                text += gm.print_readable(print_output=False)
            else:
                text += format_streams(gm, streams)
            if plan is not None:
                text += "\n\n# plan\n" + str(plan) + "\n\n" + plan.summary()
            return text + "\n"
        if self.kind == "py":
            if code is None or self.naming == "torchair":  # the graph, each node's source line
                code = gm.print_readable(print_output=False, include_stride=False)
            return f"# {title}\n" + code
        return to_dot(gm, streams, plan, title)

    def _streams(self, gm: torch.fx.GraphModule) -> StreamAssignment | None:
        try:
            return assign_streams(gm)
        except StreamError:
            return None  # an intermediate graph may hold half a scope: dump it plain

    def text_for(self, gm: torch.fx.GraphModule, title: str) -> str:
        """The dump text of ``gm`` now (the graph from before a pass that failed)."""
        return self._render(gm, self._streams(gm), None, None, title)

    def dump(
        self,
        graph_kind: str,
        step: str,
        gm: torch.fx.GraphModule,
        *,
        streams: StreamAssignment | None = None,
        plan: StreamPlan | None = None,
        code: str | None = None,
        text: str | None = None,
    ) -> str | None:
        """Write one step's dump; returns its path (the .svg, or the .dot when it could not
        be rendered), or None when this naming writes no file for the step."""
        ext = {"txt": "txt", "py": "py"}.get(self.kind, "dot")
        target = self._next(graph_kind, _slug(step), ext)
        if target is None:
            return None
        title = f"{graph_kind} {step}".strip()
        if text is None:
            if streams is None and plan is None:
                streams = self._streams(gm)
            text = self._render(gm, streams, plan, code, title)
        path = self._write(target, text)
        if self.kind == "svg":
            path = self._render_svg(path)
        return path

    def summary(
        self, graph_kind: str, plan: StreamPlan, segments: Sequence[Any] = ()
    ) -> str | None:
        """Write the stream allocation summary of a graph's plan (and its max-autotune
        segments); None when this naming writes no summary."""
        target = self._next(graph_kind, "summary", "txt")
        if target is None:
            return None
        text = plan.summary() + "\n"
        if segments:
            text += "\n" + format_segments(segments) + "\n"
        return self._write(target, text)

    def _render_svg(self, dot_path: str) -> str:
        exe = shutil.which("dot")
        if exe is None:
            warn_no_graphviz()
            return dot_path
        svg_path = dot_path[: -len(".dot")] + ".svg"
        subprocess.run([exe, "-Tsvg", dot_path, "-o", svg_path], check=True, timeout=120)
        os.remove(dot_path)
        self.written[self.written.index(dot_path)] = svg_path
        if self.naming != "torchair":
            _note_written(self.path, svg_path)
        return svg_path

    def __repr__(self) -> str:
        return f"GraphDumper({self.kind!r}, {self.path!r})"


def dumper_for(config: Any) -> GraphDumper | None:
    """The dumper a config asks for, or None when dumps are off."""
    dump = config.debug.graph_dump
    return None if dump.type is None else GraphDumper(dump.type, dump.path, dump.naming)


def dump_observer(config: Any) -> DumpObserver | None:
    """The observer writing the dumps a config asks for (its ``dumper``), or None when dumps
    are off."""
    dumper = dumper_for(config)
    return None if dumper is None else DumpObserver(dumper)


def _snapshot(gm: torch.fx.GraphModule) -> torch.fx.Graph:
    """A copy of ``gm``'s graph (nodes and their meta), rendered only if it is asked for."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return graph


class DumpObserver(CompileObserver):
    """Dumps the Dynamo graph, the graph as the pipeline receives it and after each stage, the
    final graph with its plan and code, and the plan's summary; on a failure, the graph from
    before the failing pass (a copy taken before each pass, since the pass edits in place, and
    rendered only when that pass fails)."""

    def __init__(self, dumper: GraphDumper) -> None:
        self.dumper = dumper
        self._before: dict[str, tuple[torch.fx.GraphModule, torch.fx.Graph, str]] = {}

    def graph_traced(self, gm: torch.fx.GraphModule) -> None:
        self.dumper.dump("dynamo", "", gm)

    def started(self, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self.dumper.dump(graph_kind, "after_aot", gm)

    def before_pass(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        title = f"{graph_kind} before pass {spec.name} ({spec.stage})"
        self._before[graph_kind] = (gm, _snapshot(gm), title)

    def stage_done(self, stage: str, gm: torch.fx.GraphModule, graph_kind: str) -> None:
        self.dumper.dump(graph_kind, f"after_{stage}", gm)

    def failed(self, spec: PassSpec, gm: torch.fx.GraphModule, graph_kind: str) -> str | None:
        kept = self._before.get(graph_kind)
        if kept is None:
            return None
        owner, graph, title = kept
        before = torch.fx.GraphModule(owner, graph)
        text = self.dumper.text_for(before, title)
        name = spec.name.rsplit(".", 1)[-1]
        return self.dumper.dump(graph_kind, f"before_{name}", before, text=text)

    def graph_compiled(self, compiled: Any) -> None:
        kind, plan = compiled.kind, compiled.plan
        code = compiled.executor.code
        self.dumper.dump(
            kind, "plan", compiled.graph_module, streams=compiled.streams, plan=plan, code=code
        )
        self.dumper.summary(kind, plan, compiled.segments)
