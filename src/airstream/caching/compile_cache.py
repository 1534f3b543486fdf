"""``airstream.cache_compile``: compile a function once, keep the result on disk, and have the next
process's first call load it instead of compiling.

A cache entry is one function compiled for one set of inputs: Dynamo's bytecode and guards, the
AOTAutograd wrappers and each graph as airstream's passes left it, saved by torch's own
ahead-of-time compile (:mod:`airstream.torch_internals.caching`; the graphs are
:mod:`airstream.compiler.cached_graph` objects), and beside it ``<entry>.json``: the key it was made
for (:mod:`airstream.compiler.cache_key`), the source lines it traced and the modules its bytecode
reads as globals. A load skips Dynamo's trace, AOTAutograd and the passes; it rebuilds each graph's
plan and executor (max-autotune's segments come from Inductor's FX graph cache, which lives in
Inductor's own cache directory, ``$TORCHINDUCTOR_CACHE_DIR``).

A stale entry (made for other inputs, options, versions, or code that has changed since) or one
that cannot be read is compiled again and overwritten, with one warning saying why. Calls check
the inputs' tensor metadata, the plain values the trace branched on and the grad mode, and
compile another entry when they differ. The files themselves: :mod:`airstream.caching.cache_files`.
The function must compile to one graph (``fullgraph``) and run forward only.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from airstream import torch_internals
from airstream.caching.cache_files import (
    ENTRY_FILE,
    default_root,
    entry_files,
    function_globals,
    save_entry,
    sha256,
    unsafe,
    wrapped_functions,
)
from airstream.compiler import graph_cache
from airstream.compiler.cache_key import cache_key, digest
from airstream.errors import CacheWarning
from airstream.options.config import CompilerConfig

__all__ = ["CachedFunction", "cache_compile"]

Locate = Callable[[Callable[..., Any], str], Path]


def _default_location(root: Path) -> Locate:
    def locate(fn: Callable[..., Any], key: str) -> Path:
        name = getattr(fn, "__qualname__", type(fn).__name__).replace("<", "").replace(">", "")
        return root / f"{name}-{key[:16]}" / ENTRY_FILE

    return locate


MAX_VARIANTS = 8  # entries one CachedFunction keeps in memory before it says why (Dynamo's limit)


def _warn(message: str) -> None:
    """One warning, attributed to the user's line that called the cached function."""
    frame: types.FrameType | None = sys._getframe(1)  # the caller of _warn: stacklevel 2
    level = 2
    here = str(Path(__file__).resolve().parent.parent)  # airstream, every folder of it
    while frame is not None and (
        frame.f_code.co_filename.startswith(here) or "/torch/" in frame.f_code.co_filename
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"airstream.cache_compile: {message}", CacheWarning, stacklevel=level)


class CachedFunction:
    """``fn`` compiled through the on-disk cache (see :func:`cache_compile`)."""

    key_by_type_only = True  # a module holding one is keyed without its state (cache_key.py)

    def __init__(
        self,
        fn: Callable[..., Any],
        config: CompilerConfig,
        dynamic: bool | None,
        locate: Locate,
        backend: Callable[..., Any] | None = None,
    ) -> None:
        self.fn = fn
        self.config = config
        self.dynamic = dynamic
        self.locate = locate
        self.backend = backend
        self.owner = fn.__self__ if isinstance(fn, types.MethodType) else None
        self.loaded = False  # whether the last entry prepared came from disk
        self.path: Path | None = None  # that entry's file
        self._variants: tuple[tuple[Any, bool], ...] = ()  # (compiled, takes self) each
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as a stand-in: a module holding a cached method is pickled with the guards
        of the compile that traces it, and a compile (its backend, its graphs) is no state. A
        copy of the module (deepcopy, torch.save) gets a stand-in that says so when called."""
        return (_Unpickled, (getattr(self.fn, "__qualname__", "function"),))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for compiled, self_first in self._variants:  # one, unless the inputs took two traces
            full = (self.owner, *args) if self_first else args
            if torch_internals.guards_pass(compiled, full, kwargs):
                return compiled(*full, **kwargs)
        compiled, self_first = self._prepare(args, kwargs)
        full = (self.owner, *args) if self_first else args
        return compiled(*full, **kwargs)

    def _takes_self(self, compiled: Any) -> bool:
        if self.owner is None or isinstance(compiled, _InProcess):  # a bound method as given
            return False
        return torch_internals.takes_self(compiled, self.fn)

    def _prepare(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, bool]:
        """The entry for these inputs, loaded or compiled, added to the variants in use."""
        with self._lock:
            for variant in self._variants:  # another thread may have prepared it meanwhile
                full = (self.owner, *args) if variant[1] else tuple(args)
                if torch_internals.guards_pass(variant[0], full, kwargs):
                    return variant
            if len(self._variants) == MAX_VARIANTS:
                _warn(
                    f"{self._name()} has been compiled for {MAX_VARIANTS} different sets of "
                    "inputs in this process (shapes, dtypes, strides or plain values); each "
                    "is an entry on disk and in memory: if sizes vary, cache_compile(..., "
                    "dynamic=True) compiles one for all"
                )
            if torch.is_grad_enabled() and not self._variants:
                _warn(
                    f"{self._name()} is compiled with grad enabled, so its entry holds a "
                    "training graph (its backward through a loaded entry is untested); call "
                    "it under torch.no_grad() or torch.inference_mode() for inference"
                )
            debugging = graph_cache.debugging(self.config)
            if debugging is not None:  # dumps are written by a compile, which a load skips
                _warn(
                    f"{self._name()} is compiled in this process, not through the cache: "
                    f"{debugging} is set, and a loaded entry would write nothing"
                )
                variant = (self._in_process(), False)
                self._variants = (*self._variants, variant)
                return variant
            key = cache_key(self.fn, args, kwargs, self.config, self.dynamic)
            path = self.locate(self.fn, digest(key))
            compiled = self._load(path, key, args, kwargs)
            self.loaded = compiled is not None
            if compiled is None:
                compiled = self._compile(path, key, args, kwargs)
            torch_internals.skip_guard_check(compiled)  # __call__ checks them, once
            variant = (compiled, self._takes_self(compiled))
            self._variants = (*self._variants, variant)
            self.path = path
            return variant

    def _in_process(self, backend: Callable[..., Any] | None = None) -> _InProcess:
        from airstream.backend import get_backend

        if backend is None:
            backend = self.backend if self.backend is not None else get_backend(self.config)
        compiled = torch.compile(self.fn, backend=backend, dynamic=self.dynamic, fullgraph=True)
        return _InProcess(compiled)

    def _name(self) -> str:
        return str(getattr(self.fn, "__qualname__", "the function"))

    def _load(
        self, path: Path, key: Mapping[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        binary, record_file = entry_files(path)
        if not binary.exists():
            return None
        name = self._name()
        why_unsafe = unsafe(binary)
        if why_unsafe is not None:
            _warn(
                f"the cache entry {binary} is {why_unsafe}: loading it would run code another user "
                f"could have written; compiling {name} again and replacing it"
            )
            return None
        try:
            record = json.loads(record_file.read_text())
        except (OSError, ValueError) as exc:
            _warn(
                f"the cache entry {binary} has no readable record ({exc}); compiling {name} "
                "again and replacing it"
            )
            return None
        different = sorted(k for k in key if record.get("key", {}).get(k) != key[k])
        if different:
            _warn(
                f"the cache entry {binary} was made for different {', '.join(different)} "
                f"(the fields of its key that differ); compiling {name} again and replacing it"
            )
            return None
        if record.get("sha256") != sha256(binary):
            _warn(
                f"the cache entry {binary} is not the file its record describes (a write was "
                f"cut short, or two processes wrote it); compiling {name} again and replacing it"
            )
            return None
        changed = torch_internals.changed_source([tuple(s) for s in record.get("sources", [])])
        if changed is not None:
            _warn(
                f"the cache entry {binary} is stale: the source it traced at {changed} has "
                f"changed since; compiling {name} again and replacing it"
            )
            return None
        try:
            modules = {n: importlib.import_module(m) for n, m in record["modules"].items()}
            with binary.open("rb") as f:
                compiled = torch_internals.load_compiled(
                    f, {**function_globals(self.fn), **modules}, wrapped_functions(self.fn)
                )
        except Exception as exc:
            _warn(
                f"the cache entry {binary} could not be loaded ({type(exc).__name__}: {exc}); "
                f"compiling {name} again and replacing it"
            )
            return None
        full = (self.owner, *args) if self._takes_self(compiled) else tuple(args)
        if not torch_internals.guards_pass(compiled, full, kwargs):
            _warn(
                f"the cache entry {binary} does not accept this call (its guards fail: a "
                "tensor's metadata, a plain value the trace branched on in the inputs, the "
                "module or a global, or the grad mode differs); compiling "
                f"{name} again and replacing it"
            )
            return None
        return compiled

    def _compile(
        self, path: Path, key: Mapping[str, Any], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> Any:
        from airstream.backend import get_backend

        backend = self.backend if self.backend is not None else get_backend(self.config)
        name = self._name()
        try:
            compiled = torch_internals.aot_compile(
                self.fn, backend, args, kwargs, self.dynamic, digest(key)
            )
        # what torch cannot save (a guard), or what airstream cannot (an object in the graph)
        except (torch_internals.package_error(), torch_internals.not_cached_error()) as exc:
            _warn(
                f"{name} cannot be compiled ahead of time ({exc}); it is compiled in this "
                "process with torch.compile and not saved, so the next process compiles it too"
            )
            return self._in_process(backend)
        try:
            save_entry(compiled, path, key, self.fn)
        except Exception as exc:  # torch cannot pickle everything a function may close over
            _warn(
                f"{name} is compiled but could not be saved to {path} ({type(exc).__name__}: "
                f"{str(exc).strip()[:400]}); this process runs it compiled, and the next "
                "compiles it again"
            )
        return compiled


class _InProcess:
    """A function torch.compile compiled in this process (Dynamo guards and recompiles it):
    what runs when torch cannot compile it ahead of time."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        self.compiled = compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)

    def guard_check(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def disable_guard_check(self) -> None:
        """Dynamo checks its own guards."""


class _Unpickled:
    """What a copied or unpickled CachedFunction becomes: calling it says what to do."""

    key_by_type_only = True

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            f"this is a copy of airstream.cache_compile({self.name}): a compiled function is "
            "not copied or pickled with its module; call airstream.cache_compile on the copy's "
            "method again"
        )


def cache_compile(
    fn: Callable[..., Any],
    *,
    config: CompilerConfig | None = None,
    dynamic: bool | None = False,
    cache_dir: str | os.PathLike[str] | None = None,
) -> CachedFunction:
    """``fn`` (a function or a bound method, e.g. ``model.forward``) compiled with airstream
    through the on-disk compile cache: the first call of a process loads the entry made for its
    inputs, options and versions, or compiles and saves one.

    ``cache_dir`` defaults to ``<airstream's cache directory>/compiled``
    (:func:`airstream.machine.cache_dir.cache_root`). ``fn`` must compile to one graph; call it for
    inference (under ``torch.no_grad()`` or ``torch.inference_mode()``). ``dynamic``:
    torch.compile's, but False (static shapes) by default; True compiles sizes symbolically.
    """
    if not callable(fn):
        raise TypeError(f"cache_compile() takes a function or a bound method, got {fn!r}")
    if config is None:
        config = CompilerConfig()
    if not isinstance(config, CompilerConfig):
        raise TypeError(f"config must be an airstream.CompilerConfig, got {type(config).__name__}")
    torch_internals.require("compile-cache")
    root = Path(cache_dir) if cache_dir is not None else default_root()
    return CachedFunction(fn, config, dynamic, _default_location(root))
