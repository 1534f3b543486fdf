"""Private torch APIs of Dynamo's own entry points: explain's graph breaks and its cache, a fresh
Dynamo and its compile counts, forced graph breaks, unbacked and dynamic sizes, and the backend
registry (``torch.compile(backend=...)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from airstream.torch_internals.registry import _attr, _feature, _get

# --- explain and the frames Dynamo compiled -------------------------------------------------------


@_feature(
    "dynamo_explain",
    "torch._dynamo.exc.Unsupported and torch._dynamo.eval_frame.remove_from_cache",
    "explain",
    "finding graph breaks and compiling a model without keeping its compiled code",
)
def _probe_dynamo_explain() -> tuple[type, Callable[[Any], None]]:
    unsupported = _attr("torch._dynamo.exc:Unsupported")
    if not issubclass(unsupported, Exception):
        raise TypeError("torch._dynamo.exc.Unsupported is not an exception")
    return unsupported, _attr("torch._dynamo.eval_frame:remove_from_cache")


def dynamo_unsupported() -> type[Exception]:
    """The exception Dynamo raises for a graph break under ``fullgraph=True``."""
    return _get("dynamo_explain")[0]


def remove_from_dynamo_cache(fn: Any) -> None:
    """Drop Dynamo's compiled code for ``fn`` (the next compile starts afresh)."""
    _get("dynamo_explain")[1](fn)


@_feature(
    "dynamo_frames",
    "torch._dynamo.reset, torch._dynamo.utils.counters['frames'] and "
    "torch._dynamo.decorators.mark_unbacked",
    "testing",
    "airstream selftest microbatch (a fresh Dynamo per graph, its compiles counted) and tests "
    "of unbacked sizes",
)
def _probe_dynamo_frames() -> tuple[Callable[[], None], Any, Callable[..., None]]:
    counters = _attr("torch._dynamo.utils:counters")
    if not hasattr(counters["frames"], "clear"):
        raise TypeError("torch._dynamo.utils.counters['frames'] is not a counter")
    return (
        _attr("torch._dynamo:reset"),
        counters,
        _attr("torch._dynamo.decorators:mark_unbacked"),
    )


def reset_dynamo() -> None:
    """Forget every frame Dynamo compiled, and its compile counts."""
    reset, counters, _ = _get("dynamo_frames")
    reset()
    counters["frames"].clear()


def compiled_frames() -> int:
    """How many frames Dynamo compiled since :func:`reset_dynamo`."""
    return int(_get("dynamo_frames")[1]["frames"]["ok"])


def mark_unbacked(tensor: torch.Tensor, dim: int) -> None:
    """Make ``tensor``'s dimension ``dim`` an unbacked size when Dynamo traces it (0 and 1
    included)."""
    _get("dynamo_frames")[2](tensor, dim)


@_feature("graph_break", "torch._dynamo.graph_break", "testing", "tests that force graph breaks")
def _probe_graph_break() -> Callable[[], None]:
    return _attr("torch._dynamo:graph_break")


def dynamo_graph_break() -> Callable[[], None]:
    """The function that forces a Dynamo graph break where it is called (tests; resolve it
    outside compiled code)."""
    return _get("graph_break")


@_feature(
    "backend_registry",
    "torch._dynamo.backends.registry.lookup_backend",
    "testing",
    "checking that torch.compile(backend='airstream') resolves to airstream's entry point",
)
def _probe_backend_registry() -> Callable[[str], Any]:
    return _attr("torch._dynamo.backends.registry:lookup_backend")


def lookup_backend(name: str) -> Any:
    """The callable torch.compile uses for ``backend=name``."""
    return _get("backend_registry")(name)


@_feature(
    "mark_dynamic",
    "torch._dynamo.mark_dynamic",
    "torchair",
    "torchair.inference.set_dim_gears: the dims it names become dynamic",
)
def _probe_mark_dynamic() -> Callable[..., None]:
    return _attr("torch._dynamo:mark_dynamic")


def mark_dynamic(t: Any, dim: int) -> None:
    """Compile ``t``'s dim ``dim`` as a dynamic size."""
    _get("mark_dynamic")(t, dim)


@_feature(
    "register_backend",
    "torch._dynamo.register_backend and torch._dynamo.list_backends",
    "torchair",
    "torch.compile(backend='npu') in TorchAir scripts, as torch_npu registers it",
)
def _probe_register_backend() -> tuple[Callable[..., Any], Callable[..., Any]]:
    return _attr("torch._dynamo:register_backend"), _attr("torch._dynamo:list_backends")


def register_backend(name: str, compiler_fn: Callable[..., Any]) -> None:
    """Make ``torch.compile(backend=name)`` use ``compiler_fn`` (once; later calls keep the
    first)."""
    register, listed = _get("register_backend")
    if name not in listed(exclude_tags=()):
        register(compiler_fn, name=name)
