"""Shared fixtures and helpers for airstream's tests."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

import airstream
from airstream.backend import AirstreamBackend, CompiledGraph

# auto_streams decides with fixed nominal figures in tests, so its decisions do not depend on the
# machine's load; tests/test_calibration.py measures the real ones.
os.environ.setdefault("AIRSTREAM_COSTS", "nominal")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow = pytest.mark.skip(reason="slow: run with --runslow")
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


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
