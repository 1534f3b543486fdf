"""The checks an option's values pass (:class:`airstream.options.schema.Option`'s ``check``): plain
values (a choice, a flag, a count, a gain, size bounds, a directory) and pass slots (a pass, or a
list of them, with the signature ``fn(gm, example_inputs, config)``), each raising
:class:`Invalid` with the allowed values in words.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

__all__ = [
    "PASS_SIGNATURE",
    "Check",
    "Invalid",
    "PassSlot",
    "anything",
    "boolean",
    "callable_source",
    "choice",
    "directory",
    "gain",
    "pass_slot",
    "pass_style",
    "positive_int",
    "size_bounds",
    "thread_counts",
]

PassSlot = Callable[..., Any] | tuple[Callable[..., Any], ...] | None


class Invalid(Exception):
    """Raised by a check: the value is not allowed; the message describes the allowed values."""


Check = Callable[[str, Any], Any]
"""``check(path, value)`` returns the value to store, or raises :class:`Invalid`/``TypeError``."""


def anything(path: str, value: Any) -> Any:
    """Accept any value."""
    return value


def choice(*allowed: Any) -> Check:
    """Accept one of ``allowed`` (compared by type as well: 1 is not True)."""

    def check(path: str, value: Any) -> Any:
        if not any(value == a and type(value) is type(a) for a in allowed):
            raise Invalid(", ".join(repr(a) for a in allowed))
        return value

    return check


def boolean(path: str, value: Any) -> bool:
    """Accept True or False."""
    if not isinstance(value, bool):
        raise Invalid("True, False")
    return value


def positive_int(path: str, value: Any) -> int:
    """Accept an int >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Invalid("an int >= 1")
    return value


def gain(path: str, value: Any) -> float:
    """Accept a number from 0 to 1 (a share by which one time beats another)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise Invalid("a number from 0 to 1 (0.05: 5% faster)")
    return float(value)


def size_bounds(path: str, value: Any) -> str | tuple[int, ...]:
    """Accept ``"pow2"`` or a non-empty sequence of distinct ints >= 1 (stored sorted, as a
    tuple): the upper bounds of size ranges."""
    if value == "pow2":
        return "pow2"
    if isinstance(value, (list, tuple)) and value:
        bounds = tuple(value)
        if all(type(b) is int and b >= 1 for b in bounds) and len(set(bounds)) == len(bounds):
            return tuple(sorted(bounds))
    raise Invalid("'pow2', or the ranges' upper bounds as distinct ints >= 1 (such as (1, 256))")


def thread_counts(path: str, value: Any) -> str | tuple[int, ...]:
    """Accept ``"auto"`` or a sequence of distinct ints >= 1, possibly empty (stored sorted, as
    a tuple): intra-op thread counts per stream."""
    if value == "auto":
        return "auto"
    if isinstance(value, (list, tuple)):
        counts = tuple(value)
        if all(type(c) is int and c >= 1 for c in counts) and len(set(counts)) == len(counts):
            return tuple(sorted(counts))
    raise Invalid("'auto', or thread counts as distinct ints >= 1 (such as (2, 4); () for none)")


def directory(path: str, value: Any) -> str:
    """Accept a non-empty str or path-like, stored as str."""
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise Invalid("a directory path (str)")
    return os.fspath(value)


PASS_SIGNATURE = "def my_pass(gm, example_inputs, config): ..."


def callable_source(fn: Any) -> tuple[str, int] | None:
    """Where ``fn``'s code is defined, as ``(file, first line)``; None where it cannot be read
    (builtins). Follows ``functools.wraps`` and ``partial``; a callable object: its ``__call__``."""
    target: Any = inspect.unwrap(fn)
    while isinstance(target, functools.partial):
        target = inspect.unwrap(target.func)
    if isinstance(target, type):  # a class used as a pass: called, it runs __init__
        target = vars(target).get("__init__", target)
    code = getattr(target, "__code__", None)
    if code is None and callable(target):
        code = getattr(type(target).__call__, "__code__", None)
    return None if code is None else (code.co_filename, code.co_firstlineno)


def _describe(fn: Any) -> str:
    """``fn``'s qualified name and source location, for error messages."""
    target = inspect.unwrap(fn)
    if isinstance(target, functools.partial):
        return f"functools.partial({_describe(target.func)})"
    qualname = getattr(target, "__qualname__", None) or f"{type(target).__qualname__}.__call__"
    module = getattr(target, "__module__", None)
    name = f"{module}.{qualname}" if module else qualname
    where = callable_source(fn)
    return f"{name} ({where[0]}:{where[1]})" if where else name


def pass_style(fn: Any) -> str | None:
    """How a pass is called: ``"airstream"`` (``fn(gm, example_inputs, config)``; also where its
    signature cannot be read, as for some builtins), ``"graph"`` (Inductor's custom passes:
    ``fn(graph)``, ``CustomGraphPass`` and ``CustomGraphModulePass`` instances), or None
    where it can be called neither way. An Inductor pass object is ``"graph"`` whatever its
    signature (``def __call__(self, graph, extra=None)`` binds three arguments too)."""
    from airstream.torch_internals import is_inductor_pass  # torch: only once a pass is given

    if is_inductor_pass(fn):
        return "graph"
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return "airstream"
    for style, arguments in (("airstream", (None, None, None)), ("graph", (None,))):
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return style
    return None


def _check_pass_signature(path: str, fn: Any) -> None:
    """Raise ``TypeError`` unless ``fn`` can be called as ``fn(gm, example_inputs, config)`` or,
    as Inductor calls its custom passes, ``fn(graph)``; callables whose signature cannot be read
    (some builtins) are accepted."""
    if pass_style(fn) is not None:
        return
    signature = inspect.signature(fn)
    try:
        signature.bind(None, None, None)
    except TypeError as exc:
        raise TypeError(
            f"{path}: the pass {_describe(fn)} takes {signature}, but airstream calls every pass "
            f"as fn(gm, example_inputs, config) ({exc}). Define it as\n"
            f"    {PASS_SIGNATURE}\n"
            "and edit gm.graph in place (the return value is ignored)."
        ) from None


def pass_slot(path: str, value: Any) -> PassSlot:
    """Accept None, one callable, or a sequence of callables (stored as a tuple), each callable
    as ``fn(gm, example_inputs, config)``."""
    if value is None:
        return value
    if callable(value):
        _check_pass_signature(path, value)
        return value
    if isinstance(value, (list, tuple)):
        for i, fn in enumerate(value):
            if not callable(fn):
                raise TypeError(
                    f"{path}[{i}] must be a callable fn(gm, example_inputs, config), "
                    f"got {type(fn).__name__} {fn!r}"
                )
            _check_pass_signature(f"{path}[{i}]", fn)
        return tuple(value)
    raise TypeError(
        f"{path} must be a callable fn(gm, example_inputs, config) or a list of them, "
        f"got {type(value).__name__} {value!r}"
    )
