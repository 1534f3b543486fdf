"""A compile-cache entry on disk (:mod:`airstream.caching.compile_cache`): its two files, how they
are written (each atomically, the pair checked by the binary's digest, for the owner only) and read
back safely, and the listing and clearing behind ``airstream cache``.

An entry is ``<name>`` (torch's saved function) and ``<name>.json`` (its record: the key, the
source lines the trace read, the module globals Dynamo named by object id, the binary's sha256).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import tempfile
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from airstream import torch_internals
from airstream.machine.cache_dir import cache_root

__all__ = [
    "ENTRY_FILE",
    "EntryInfo",
    "clear_entries",
    "default_root",
    "entry_files",
    "function_globals",
    "wrapped_functions",
    "list_entries",
    "save_entry",
    "sha256",
    "unsafe",
]

ENTRY_FILE = "compiled.bin"


def entry_files(path: Path) -> tuple[Path, Path]:
    """An entry's compiled file and its JSON record."""
    return path, path.with_name(path.name + ".json")


def sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def unsafe(path: Path) -> str | None:
    """Why loading ``path`` (pickled code) is not safe, or None: owned by another user, or
    writable by others."""
    if not hasattr(os, "getuid"):
        return None
    info = path.stat()
    if info.st_uid != os.getuid():
        return f"owned by another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by other users"
    return None


def function_globals(fn: Callable[..., Any]) -> dict[str, Any]:
    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    return dict(getattr(func, "__globals__", {}))


def wrapped_functions(fn: Callable[..., Any]) -> dict[str, Any]:
    """The functions a decorated ``fn`` wraps, outermost first, as ``functools.wraps`` records
    them (``__wrapped__``), by a name of their place in that chain. A saved compile refers to
    them (the wrapper's closure holds the function it calls), and pickle cannot save them by
    name: their qualified name finds the wrapper (transformers' ``LlamaForCausalLM.forward``
    under ``can_return_tuple``). They are saved as references to what the same chain of the
    function holds in the process that loads the entry."""
    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    found: dict[str, Any] = {}
    inner = getattr(func, "__wrapped__", None)
    while callable(inner) and not any(inner is seen for seen in found.values()):
        found[f"airstream.wrapped.{len(found)}"] = inner
        inner = getattr(inner, "__wrapped__", None)
    return found


def _modules_read(compiled: Any, fn: Callable[..., Any]) -> dict[str, str]:
    """The globals the bytecode reads that hold modules (Dynamo names some by object id, so a
    new process must be given them): name -> module name."""
    scope = function_globals(fn)
    return {
        name: scope[name].__name__
        for name in torch_internals.global_names(compiled)
        if isinstance(scope.get(name), types.ModuleType)
    }


def save_entry(compiled: Any, path: Path, key: Mapping[str, Any], fn: Callable[..., Any]) -> None:
    """Write the entry: each file atomically, and the pair checked by the binary's digest."""
    binary, record_file = entry_files(path)
    binary.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "key": dict(key),
        "sources": torch_internals.traced_sources(compiled),
        "modules": _modules_read(compiled, fn),
        "sha256": None,
    }
    # The record goes first and names the binary's digest: a reader that finds a binary whose
    # digest is not its record's (a write cut short, two writers) compiles instead of loading.
    record_file.unlink(missing_ok=True)
    external = wrapped_functions(fn)
    _atomic(binary, lambda tmp: torch_internals.save_compiled(compiled, tmp, external))
    record["sha256"] = sha256(binary)
    _atomic(record_file, lambda tmp: Path(tmp).write_text(json.dumps(record, indent=1)))


def _atomic(target: Path, write: Callable[[str], Any]) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One entry on disk: its compiled file, the function it compiles, its size and age."""

    path: Path
    function: str
    bytes: int
    modified: float


def default_root() -> Path:
    """Where :func:`cache_compile` keeps entries unless told otherwise."""
    return cache_root() / "compiled"


def list_entries(root: Path) -> list[EntryInfo]:
    """Every entry under ``root`` (airstream's layout or TorchAir's), oldest first."""
    found = []
    for record_file in root.rglob("*.json") if root.is_dir() else ():
        binary = record_file.with_name(record_file.name[: -len(".json")])
        if not binary.is_file():
            continue
        try:
            function = json.loads(record_file.read_text())["key"]["function"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        size = binary.stat().st_size + record_file.stat().st_size
        found.append(EntryInfo(binary, str(function), size, binary.stat().st_mtime))
    return sorted(found, key=lambda e: e.modified)


def clear_entries(root: Path) -> tuple[int, int]:
    """Delete every entry under ``root`` (and the directories left empty): (entries, bytes)."""
    entries = list_entries(root)
    for entry in entries:
        binary, record_file = entry_files(entry.path)
        binary.unlink(missing_ok=True)
        record_file.unlink(missing_ok=True)
        parent = binary.parent
        while parent != root and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return len(entries), sum(e.bytes for e in entries)
