"""``torchair.inference.cache_compile`` on airstream's compile cache
(:mod:`airstream.caching.compile_cache`), in TorchAir's directory layout, and the names of
``torchair.inference._cache_compiler`` TorchAir's own tests use (``CompiledModel.get_cache_bin``,
``ModelCacheSaver``).

An entry lives where TorchAir puts it:
``<cache_dir | $TORCHAIR_CACHE_HOME | ./.torchair_cache>/<Class>_<dynamic|static>[_aclgraphcache]_
<md5 of the module and the options>/[world<W>global_rank<R>_][tp_rank<T>_][pp_rank<P>]/<method>/
compiled_module``. What is inside is airstream's (TorchAir's pickled GE graphs do not exist off
the NPU): a file TorchAir wrote cannot be read here, and is compiled again with one warning.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from airstream.caching.cache_files import entry_files
from airstream.caching.compile_cache import CachedFunction
from airstream.compat.torchair.config import CompilerConfig
from airstream.compiler.cache_key import pass_identity
from airstream.machine import environment

__all__ = ["CompiledModel", "ModelCacheSaver", "TorchairCached", "cache_compile", "readable_cache"]

FILE = "compiled_module"


def _options_text(config: CompilerConfig) -> str:
    local, _ = config.as_dict()
    for slot in ("post_grad_custom_pre_pass", "post_grad_custom_post_pass"):
        fn = getattr(config, slot).value
        if fn is not None:
            local[slot] = pass_identity(fn)
    return ",".join(f"{k}={v}" for k, v in local.items())


def _rank_dir(global_rank: int | None, tp_rank: int | None, pp_rank: int | None) -> str:
    parts = []
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        rank = dist.get_rank() if global_rank is None else global_rank
        parts.append(f"world{dist.get_world_size()}global_rank{rank}")
    if tp_rank is not None:
        parts.append(f"tp_rank{tp_rank}")
    if pp_rank is not None:
        parts.append(f"pp_rank{pp_rank}")
    return "_".join(parts)


class CompiledModel:
    """TorchAir's cache-file class; here only its path rule."""

    FILE = FILE

    @staticmethod
    def get_cache_bin(
        func: Callable[..., Any],
        *,
        config: CompilerConfig | None = None,
        dynamic: bool = True,
        cache_dir: str | None = None,
        global_rank: int | None = None,
        tp_rank: int | None = None,
        pp_rank: int | None = None,
        ge_cache: bool = False,
        **kwargs: Any,
    ) -> str:
        """The file ``cache_compile(func, ...)`` keeps its entry in."""
        root = (
            cache_dir
            or environment.TORCHAIR_CACHE_HOME.read()
            or os.path.join(os.getcwd(), ".torchair_cache")
        )
        config = config if config is not None else CompilerConfig()
        if isinstance(func, types.MethodType):
            text, name = str(func.__self__), type(func.__self__).__name__
        else:
            text, name = inspect.getsource(func), func.__name__
        digest = hashlib.md5((text + _options_text(config)).encode()).hexdigest()
        parts = [name, "dynamic" if dynamic else "static"]
        mode = config.mode.value
        if mode in ("reduce-overhead", "npugraph_ex"):
            parts.append("aclgraphcache")
        if mode == "max-autotune" and ge_cache:
            parts.append("gecache")
        parts.append(digest)
        rank = _rank_dir(global_rank, tp_rank, pp_rank)
        path = os.path.join(root, "_".join(parts), rank, func.__name__, FILE)
        return os.path.realpath(path)


class ModelCacheSaver:
    """Compiles a method and writes its entry: what a call that finds no entry goes through."""

    def __init__(self, cached: CachedFunction) -> None:
        self.cached = cached

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.cached(*args, **kwargs)

    @classmethod
    def remove_cache(cls, cache_bin: str) -> None:
        """Delete an entry's directory (or one file); nothing if it does not exist."""
        if not os.path.exists(cache_bin):
            return
        if os.path.isdir(cache_bin):
            shutil.rmtree(cache_bin)
        else:
            os.remove(cache_bin)


class TorchairCached:
    """What ``cache_compile`` returns: the method, loaded from its entry or compiled into it."""

    key_by_type_only = True  # a module holding one is keyed without its state (cache_key.py)

    def __init__(self, cached: CachedFunction, cache_bin: str) -> None:
        self.cached = cached
        self.cache_bin = cache_bin
        self._started = False

    def __reduce__(self) -> tuple[Any, ...]:
        return self.cached.__reduce__()  # see CachedFunction.__reduce__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():  # TorchAir's cached methods run for inference
            if self._started:
                return self.cached(*args, **kwargs)
            self._started = True
            if os.path.exists(self.cache_bin):
                return self.cached(*args, **kwargs)
            return ModelCacheSaver(self.cached)(*args, **kwargs)


def cache_compile(
    func: Callable[..., Any],
    *,
    config: CompilerConfig | None = None,
    backend: Any = None,
    dynamic: bool = True,
    cache_dir: str | None = None,
    global_rank: int | None = None,
    tp_rank: int | None = None,
    pp_rank: int | None = None,
    custom_decompositions: Mapping[Any, Callable[..., Any]] | None = None,
    ge_cache: bool = False,
) -> TorchairCached:
    """TorchAir's ``cache_compile``: ``func`` (a method of an ``nn.Module``) compiled once and
    kept on disk; a new process's first call loads it."""
    from airstream.compat.torchair import get_npu_backend

    backend_config = getattr(backend, "torchair_config", None)
    if config is not None and backend is not None and backend_config is not config:
        raise ValueError(
            "config in current backend is different from the config during cache generation."
        )
    config = config if config is not None else backend_config
    if not isinstance(func, types.MethodType):
        raise ValueError(f"Only method can be cached now, got {func}")
    if not isinstance(func.__self__, torch.nn.Module):
        raise ValueError(f"Only torch.nn.Module method can be cached now, got {func}")
    if cache_dir is not None and os.path.exists(cache_dir) and hasattr(os, "getuid"):
        if os.stat(cache_dir).st_uid != os.getuid():
            raise ValueError(f"Cache dir {cache_dir} must be owned by the current user ")
    config = config if config is not None else CompilerConfig()
    if backend is None:
        backend = get_npu_backend(
            compiler_config=config, custom_decompositions=custom_decompositions
        )
    cache_bin = CompiledModel.get_cache_bin(
        func,
        config=config,
        dynamic=dynamic,
        cache_dir=cache_dir,
        global_rank=global_rank,
        tp_rank=tp_rank,
        pp_rank=pp_rank,
        ge_cache=ge_cache,
    )
    cached = CachedFunction(
        func, config.airstream, dynamic, lambda fn, key: Path(cache_bin), backend=backend
    )
    return TorchairCached(cached, cache_bin)


def readable_cache(cache_bin: str, print_output: bool = True, file: str | None = None) -> str:
    """What an entry holds, as text: the function it compiles, the key it was made for and the
    source lines it traced (printed, and written to ``file`` as comments when given)."""
    import json

    path = Path(cache_bin)
    if not path.exists():
        raise ValueError(f"Cache file {cache_bin} is not exists")
    if path.is_symlink():
        raise ValueError(f"Cache file {cache_bin} can not be a symlink")
    _, record_file = entry_files(path)
    try:
        record = json.loads(record_file.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"Cache file {cache_bin} has no readable record ({exc})") from None
    key = record.get("key", {})
    lines = [f"function: {key.get('function')}", f"compiled file: {cache_bin}"]
    lines += [f"key.{k}: {v}" for k, v in sorted(key.items()) if k != "function"]
    lines += [f"traced: {m} lines {a}-{b}" for m, a, b, _ in record.get("sources", [])]
    text = "\n".join(lines)
    if print_output:
        print(text)
    if file is not None:
        if os.path.islink(file):
            raise ValueError(f"Output file {file} can not be a symlink")
        Path(file).write_text("\n".join(f"# {line}" for line in lines) + "\n")
    return text
