"""Private torch APIs of torch.compile's restart with airstream's backend
(:mod:`airstream.compiler.graph_cache`): AOTAutograd's own cache, which looks a Dynamo graph up
before tracing it when the graph compiler says it returns an ``OutputCode``
(``SerializableAOTDispatchCompiler``), and saves the compiler's result itself in the entry when
``bundled_autograd_cache`` is on; its key holds ``torch.compiler.config.cache_key_tag``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from airstream.torch_internals.caching import entry_tag
from airstream.torch_internals.registry import _attr, _feature, _optional, _takes


@_feature(
    "autograd_cache",
    "torch._functorch._aot_autograd.schemas.SerializableAOTDispatchCompiler(output_code_ty, "
    "compiler_fn), torch._functorch.config.bundled_autograd_cache and .enable_autograd_cache, "
    "torch._functorch."
    "_aot_autograd.autograd_cache.should_use_local_autograd_cache(), "
    "torch.compiler.config.cache_key_tag, torch._functorch._aot_autograd.autograd_cache."
    "BypassAOTAutogradCache",
    "compile-cache",
    "torch.compile with airstream keeping its graphs in AOTAutograd's cache for the next process",
)
def _probe_autograd_cache() -> tuple[type, Any, Callable[[], bool], type]:
    serializable: type = _attr(
        "torch._functorch._aot_autograd.schemas:SerializableAOTDispatchCompiler"
    )
    _takes(serializable, "output_code_ty", "compiler_fn")
    functorch_config = _attr("torch._functorch:config")
    for option in ("bundled_autograd_cache", "enable_autograd_cache"):
        if not isinstance(getattr(functorch_config, option), bool):
            raise AttributeError(f"torch._functorch.config.{option} is not a bool option")
    local: Callable[[], bool] = _attr(
        "torch._functorch._aot_autograd.autograd_cache:should_use_local_autograd_cache"
    )
    if not isinstance(torch.compiler.config.cache_key_tag, str):
        raise AttributeError("torch.compiler.config.cache_key_tag is not a str option")
    bypass: type = _attr("torch._functorch._aot_autograd.autograd_cache:BypassAOTAutogradCache")
    return serializable, functorch_config, local, bypass


def _found() -> tuple[type, Any, Callable[[], bool], type] | None:
    found: tuple[type, Any, Callable[[], bool], type] | None = _optional(
        "autograd_cache", until="torch.compile with airstream compiles every graph in every process"
    )
    return found


def autograd_cache_on() -> bool:
    """Whether AOTAutograd's local cache is on (torch's switches: ``TORCHINDUCTOR_AUTOGRAD_CACHE``,
    ``torch.compiler.config.force_disable_caches``) and this torch has what saving needs."""
    found = _found()
    return found is not None and bool(found[2]())


def serializable_compiler(compiler: Callable[..., Any], output_code: type) -> Any:
    """``compiler`` as AOTAutograd's ``SerializableAOTDispatchCompiler``: AOTAutograd then looks
    the graph up in its cache before tracing it (``output_code``: the type it returns)."""
    found = _found()
    if found is None:
        return compiler
    return found[0](output_code, compiler)


@contextlib.contextmanager
def saving_graphs(key: str) -> Iterator[None]:
    """Within: AOTAutograd saves the graph compilers' results in its cache entries, under keys
    that also hold ``key`` (Inductor's segment compiles drop it again: ``segment_cache_tag``)."""
    found = _found()
    if found is None:
        yield
        return
    with (
        found[1].patch(bundled_autograd_cache=True),
        torch.compiler.config.patch(  # type: ignore[attr-defined]
            cache_key_tag=entry_tag(key)
        ),
    ):
        yield


def not_cached(reason: str) -> Exception:
    """The exception that tells AOTAutograd's cache to save nothing for this graph (a bypass,
    logged at info level), with ``reason``."""
    found = _found()
    if found is None:
        return RuntimeError(reason)
    error: Exception = found[3](reason)
    return error


@contextlib.contextmanager
def autograd_cache_off() -> Iterator[None]:
    """Within: AOTAutograd's cache neither serves nor saves a graph (every graph compiles in this
    process, as ``TORCHINDUCTOR_AUTOGRAD_CACHE=0`` does)."""
    found = _found()
    if found is None:
        yield
        return
    with found[1].patch(enable_autograd_cache=False):
        yield


def not_cached_error() -> type[Exception]:
    """The type of :func:`not_cached`'s exception (what AOTAutograd raises on with its strict
    cache, as an ahead-of-time compile sets it)."""
    found = _found()
    return RuntimeError if found is None else found[3]
