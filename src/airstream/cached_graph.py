"""A compiled graph that can be saved: what an ahead-of-time compile
(:mod:`airstream.compile_cache`) hands AOTAutograd, which pickles it into the function's entry.

It holds the graph as the passes left it (user passes, built-in passes, stream lowering: the work
a cache hit skips) and the options the rest of the compile reads; the executor itself (generated
code, worker threads, Inductor kernels) is rebuilt when the entry is loaded
(:func:`airstream.finish.finish_graph`: streams, plan, max-autotune segments, executor), which
takes a fraction of the compile. The class derives from Inductor's ``OutputCode``, the type
AOTAutograd's bundled cache entry holds; it is made on first use (``CachedGraph`` is looked up
through the module's ``__getattr__``), so importing airstream does not import Inductor.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airstream import torch_internals
from airstream.config import CompilerConfig
from airstream.finish import finish_graph
from airstream.observers import CompileObserver

if TYPE_CHECKING:
    from airstream.runtime.codegen import Executor

__all__ = ["cached_graph", "saved_options"]


def saved_options(config: CompilerConfig) -> dict[str, Any]:
    """The config's options that can be saved: every one but the pass slots and other
    callables (the passes have run; the graph saved is their result)."""
    saved = {}
    for path, value in config.as_dict().items():
        if callable(value) or (isinstance(value, tuple) and any(callable(v) for v in value)):
            continue
        try:
            pickle.dumps(value)
        except Exception:  # an open option holding an object that cannot be saved
            continue
        saved[path] = value
    return saved


class _Saved:
    """The behaviour of ``CachedGraph`` (its base class is Inductor's, resolved on first use)."""

    def __init__(
        self,
        graph: bytes,
        options: dict[str, Any],
        kind: str,
        executor: Any,
        static_inputs: tuple[int, ...] | None,
    ) -> None:
        self.graph = graph
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
        self.executor = None

    def post_compile(
        self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any
    ) -> None:
        """Rebuild the executor of a loaded entry (a no-op in the process that compiled it)."""
        if self.executor is not None:
            return
        gm = torch_internals.load_graph(self.graph)
        config = CompilerConfig.from_options(self.options)
        self.executor = finish_graph(
            gm, config, self.kind, CompileObserver(), static_inputs=self.static_inputs
        )

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        """Inductor's Triton kernels: a loaded entry's segments come from Inductor's caches."""


@functools.cache
def _cached_graph_class() -> type:
    base = torch_internals.output_code_base()
    cls = type(
        "CachedGraph", (_Saved, base), {"__module__": __name__, "__qualname__": "CachedGraph"}
    )
    return cls


def __getattr__(name: str) -> Any:
    if name == "CachedGraph":  # what pickle looks up when it loads an entry
        return _cached_graph_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cached_graph(
    graph: bytes,
    config: CompilerConfig,
    kind: str,
    executor: Executor,
    static_inputs: tuple[int, ...] | None,
) -> Any:
    """A ``CachedGraph`` running ``executor`` now and rebuilding it from ``graph`` on load."""
    cls = _cached_graph_class()
    return cls(graph, saved_options(config), kind, executor, static_inputs)
