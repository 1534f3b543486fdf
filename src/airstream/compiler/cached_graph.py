"""A compiled graph that can be saved: what an ahead-of-time compile
(:mod:`airstream.caching.compile_cache`) hands AOTAutograd, which pickles it into the function's
entry.

It holds the graph as the passes left it (user passes, built-in passes, stream lowering: the work
a cache hit skips) and the options the rest of the compile reads; the executor itself (generated
code, worker threads, Inductor kernels) is rebuilt when the entry is loaded
(:func:`airstream.compiler.finish.finish_graph`: streams, plan, max-autotune segments, executor),
which takes a fraction of the compile. The class derives from Inductor's ``OutputCode``, the type
AOTAutograd's bundled cache entry holds; it is made on first use (``CachedGraph`` is looked up
through the module's ``__getattr__``), so importing airstream does not import Inductor.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airstream import torch_internals
from airstream.compiler.cache_key import saved_options
from airstream.compiler.measuring import finish_placed
from airstream.debug.observers import CompileObserver
from airstream.options.config import CompilerConfig
from airstream.runtime.capture_pool import CapturePool

if TYPE_CHECKING:
    from airstream.runtime.codegen import Executor

__all__ = ["cached_graph", "cached_graph_class", "loading_for"]


@dataclass(frozen=True)
class _Loading:
    """Who a graph loaded now reports to: the compiling backend's observers (its ``graphs``
    list, dumps) and the capture pool its Dynamo graph's graphs share."""

    observer: CompileObserver
    capture_pool: CapturePool | None


_LOADING: contextvars.ContextVar[_Loading | None] = contextvars.ContextVar(
    "airstream_loading", default=None
)


@contextlib.contextmanager
def loading_for(observer: CompileObserver, capture_pool: CapturePool | None) -> Iterator[None]:
    """Within: a graph AOTAutograd loads from its cache announces itself to ``observer`` (the
    backend compiling the Dynamo graph it belongs to), as a compiled one does."""
    token = _LOADING.set(_Loading(observer, capture_pool))
    try:
        yield
    finally:
        _LOADING.reset(token)


class _Saved:
    """The behaviour of ``CachedGraph`` (its base class is Inductor's, resolved on first use)."""

    def __init__(
        self,
        graph: bytes | str,
        options: dict[str, Any],
        kind: str,
        executor: Any,
        static_inputs: tuple[int, ...] | None,
    ) -> None:
        self.graph = graph  # a str: why the graph could not be saved
        self.options = options
        self.kind = kind
        self.executor = executor
        # parameters and buffers among the inputs, as AOTAutograd said at compile time (a load
        # has no such context; a CUDA graph captures these by address instead of copying them)
        self.static_inputs = static_inputs
        self._boxed_call = True  # an instance attribute: AOTAutograd's wrappers copy __dict__

    def __call__(self, inputs: list[Any]) -> Any:
        return self.executor(inputs)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["executor"] = None  # rebuilt on load
        return state

    def prepare_for_serialization(self) -> None:
        """Called on the copy AOTAutograd saves; a graph that could not be dumped is not saved
        (AOTAutograd counts a bypass and compiles it again next time)."""
        if isinstance(self.graph, str):
            raise torch_internals.not_cached(f"airstream could not save the graph: {self.graph}")
        self.executor = None

    def post_compile(
        self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any
    ) -> None:
        """Rebuild the executor of a loaded entry (a no-op in the process that compiled it)."""
        if self.executor is not None:
            return
        if isinstance(self.graph, str):  # never saved, so never loaded
            raise RuntimeError(f"a graph that was not saved was loaded: {self.graph}")
        gm = torch_internals.load_graph(self.graph)
        config = CompilerConfig.from_options(self.options)
        loading = _LOADING.get() or _Loading(CompileObserver(), None)
        self.executor = finish_placed(
            gm,
            config,
            self.kind,
            loading.observer,
            capture_pool=loading.capture_pool,
            static_inputs=self.static_inputs,
            loaded=True,
        )

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        """Inductor's Triton kernels: a loaded entry's segments come from Inductor's caches."""


@functools.cache
def cached_graph_class() -> type:
    """``CachedGraph``: airstream's result type for AOTAutograd (an Inductor ``OutputCode``)."""
    base = torch_internals.output_code_base()
    cls = type(
        "CachedGraph", (_Saved, base), {"__module__": __name__, "__qualname__": "CachedGraph"}
    )
    return cls


def __getattr__(name: str) -> Any:
    if name == "CachedGraph":  # what pickle looks up when it loads an entry
        return cached_graph_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cached_graph(
    graph: bytes | str,
    config: CompilerConfig,
    kind: str,
    executor: Executor,
    static_inputs: tuple[int, ...] | None,
) -> Any:
    """A ``CachedGraph`` running ``executor`` now and rebuilding it from ``graph`` on load
    (a str: why the graph could not be dumped; AOTAutograd then saves nothing)."""
    cls = cached_graph_class()
    return cls(graph, saved_options(config), kind, executor, static_inputs)
