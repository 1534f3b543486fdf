"""Shared fixtures and helpers for airstream's tests."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from hypothesis import settings

import airstream
from airstream.backend import AirstreamBackend, CompiledGraph
from airstream.graph.nodes import MADE_AFTER_KEY

# auto_streams decides with fixed nominal figures in tests, so its decisions do not depend on the
# machine's load; tests/test_calibration.py measures the real ones.
os.environ.setdefault("AIRSTREAM_COSTS", "nominal")
# measured decisions are not kept between tests (test_decisions.py turns it on, in a temp dir)
os.environ.setdefault("AIRSTREAM_DECISIONS", "off")
# A config left at mode="default" compiles in reduce-overhead (aten calls) in tests: the default
# on CPU, max-autotune, is an Inductor compile per segment. tests/test_mode.py tests the default
# itself; the max-autotune tests set the mode.
os.environ.setdefault("AIRSTREAM_MODE", "reduce-overhead")
# torch.compile's graphs are kept in AOTAutograd's cache (airstream.compiler.graph_cache). Within a
# run, a test that compiles a graph an earlier test compiled loads it, which exercises the load
# path. Across runs, an entry an earlier run saved would serve a test whose pass records what it
# computed (a load runs no pass). So the tests keep Inductor's caches in a directory of their own
# and each run starts with its AOTAutograd entries deleted (pytest_configure); the segments' FX
# graph cache stays, so a second run compiles no kernel the first compiled.
if "AIRSTREAM_TESTS_INDUCTOR_CACHE" not in os.environ:  # set once: xdist's workers inherit it
    _inductor_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"
    )
    os.environ["AIRSTREAM_TESTS_INDUCTOR_CACHE"] = os.path.join(_inductor_cache, "airstream-tests")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ["AIRSTREAM_TESTS_INDUCTOR_CACHE"]


# Two test sets. The default set (`python -m pytest -q -n auto`) keeps every code path and runs
# in a few minutes on 2 cores; `--runslow` adds the tests marked slow (the full suite, what CI
# runs on the newest torch) and Hypothesis' full example counts. Each slow test names its fast
# representative: a default-set test that reaches the same code path (checked at collection).
settings.register_profile("default", max_examples=5)
settings.register_profile("full", max_examples=60)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="the full suite: also the tests marked slow, and Hypothesis' full example counts",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once per run, before xdist starts its workers
        shutil.rmtree(os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "aotautograd"), True)
    # before the test modules are imported: their @settings inherit the profile's counts
    if config.getoption("--hypothesis-profile", None) is None:
        settings.load_profile("full" if config.getoption("--runslow") else "default")


def slow(why: str, fast: str) -> pytest.MarkDecorator:
    """Mark a test slow: skipped unless ``--runslow``. ``why`` says what makes it slow; ``fast``
    names the default-set test (``tests/<file>.py::<test>``, parameters left out) that reaches
    the same code path."""
    return pytest.mark.slow(reason=f"{why}; fast representative: {fast}", fast=fast)


def _check_representatives(items: list[pytest.Item]) -> None:
    """Every slow test's representative exists and is in the default set, wherever its file
    was collected (a run of one file checks that file's)."""
    by_function: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_function.setdefault(item.nodeid.split("[")[0], []).append(item)
    files = {nodeid.split("::")[0] for nodeid in by_function}
    problems = []
    for item in items:
        mark = item.get_closest_marker("slow")
        if mark is None:
            continue
        fast = mark.kwargs.get("fast")
        if not fast:
            problems.append(f"{item.nodeid}: slow without a fast representative (use slow())")
            continue
        if fast.split("::")[0] not in files:
            continue
        found = by_function.get(fast, [])
        if not found:
            problems.append(f"{item.nodeid}: its fast representative {fast} does not exist")
        elif all(f.get_closest_marker("slow") is not None for f in found):
            problems.append(f"{item.nodeid}: its fast representative {fast} is slow too")
    if problems:
        message = "slow tests:\n  " + "\n  ".join(problems)
        if os.environ.get("PYTEST_XDIST_WORKER"):  # xdist reports a worker's error as a crash
            print(f"\n{message}\n", file=sys.__stderr__, flush=True)  # of the test it ran first
        raise pytest.UsageError(message)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_representatives(items)
    if not config.getoption("--runslow"):  # outside the default set: deselected, not skipped
        slow_items = [item for item in items if "slow" in item.keywords]
        if slow_items:
            config.hook.pytest_deselected(items=slow_items)
            items[:] = [item for item in items if "slow" not in item.keywords]
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


@pytest.fixture
def default_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode users get: ``AIRSTREAM_MODE`` unset, so a config left at ``mode="default"``
    compiles as it does for them (Inductor segments on CPU)."""
    monkeypatch.delenv("AIRSTREAM_MODE", raising=False)


@pytest.fixture
def sigint_raises() -> Any:
    """SIGINT raises KeyboardInterrupt in the main thread for the test, as in an interactive
    process. A process started in the background by a non-interactive shell (``cmd &``, as CI
    scripts do) inherits SIGINT ignored, and Python then installs no handler: a test of Ctrl-C
    would see nothing arrive."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def finished_graphs(monkeypatch: pytest.MonkeyPatch) -> list[torch.fx.GraphModule]:
    """Every graph a compile finishes, in order (:func:`airstream.compiler.finish.finish_graph` as
    the compiling and loading call it: the placement, each candidate measured beside it, one
    stream)."""
    import airstream.compiler.measuring as measuring

    graphs: list[torch.fx.GraphModule] = []
    finish = measuring.finish_graph

    def keep(gm: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        graphs.append(gm)
        return finish(gm, *args, **kwargs)

    monkeypatch.setattr(measuring, "finish_graph", keep)
    return graphs


@pytest.fixture
def compiled_here() -> Any:
    """torch.compile compiles every graph in this process: AOTAutograd's cache, which would
    serve a graph an earlier test saved (airstream.compiler.graph_cache), is off for the test. For
    tests that change airstream's own code in place (a monkeypatch is in no cache key) or look at
    what a pass computed from this compile's example inputs."""
    from airstream import torch_internals

    with torch_internals.autograd_cache_off():
        yield


@pytest.fixture(autouse=True)
def _reset_dynamo() -> Any:
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def compile_model(
    model: Callable[..., Any],
    config: airstream.CompilerConfig | None = None,
    **compile_kwargs: Any,
) -> tuple[Callable[..., Any], AirstreamBackend]:
    """torch.compile ``model`` with an airstream backend; return (compiled, backend)."""
    backend = airstream.get_backend(compiler_config=config)
    return torch.compile(model, backend=backend, **compile_kwargs), backend


def graph_of(backend: AirstreamBackend, kind: str) -> CompiledGraph:
    """The last compiled graph of ``kind`` ("inference", "forward", "backward")."""
    graphs = [g for g in backend.graphs if g.kind == kind]
    assert graphs, f"no {kind} graph compiled; got {[g.kind for g in backend.graphs]}"
    return graphs[-1]


def ops_by_stream(graph: CompiledGraph) -> dict[tuple[Any, str | None], int]:
    """How many nodes of each (op, stream) the compiled graph runs, counting the members of each
    fused max-autotune segment on the segment's stream: one answer in every mode."""
    fused = {s.node: s.segment for s in graph.segments if s.node is not None}
    counts: dict[tuple[Any, str | None], int] = {}
    for node in graph.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        segment = fused.get(node.name)
        if MADE_AFTER_KEY in node.meta:  # a view a segment's member makes: counted there
            continue
        if segment is None:
            key = (node.target, graph.streams.stream(node))
            counts[key] = counts.get(key, 0) + 1
            continue
        for member in segment.members:
            key = (member.target, segment.stream)
            counts[key] = counts.get(key, 0) + 1
    return counts


def targets(gm: torch.fx.GraphModule) -> list[Any]:
    """The call_function targets of ``gm`` in graph order."""
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def count(gm: torch.fx.GraphModule, target: Any) -> int:
    """How many nodes of ``gm`` call ``target``."""
    return sum(1 for t in targets(gm) if t is target)


def assert_same(got: Any, want: Any, **tol: Any) -> None:
    """Compare (nested) outputs with torch.testing.assert_close (exact by default)."""
    if not tol:
        tol = {"rtol": 0, "atol": 0}
    if isinstance(want, Sequence) and not isinstance(want, torch.Tensor):
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert_same(g, w, **tol)
    else:
        torch.testing.assert_close(got, want, **tol)


def cause_of(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of type ``kind`` in ``exc``'s cause chain (Dynamo wraps backend
    errors in BackendCompilerFailed, whose ``inner_exception`` is the original)."""
    current: BaseException | None = exc
    seen: list[BaseException] = []
    while current is not None and current not in seen:
        if isinstance(current, kind):
            return current
        seen.append(current)
        current = current.__cause__ or getattr(current, "inner_exception", None)
    return None
