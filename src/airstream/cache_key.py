"""What a compile-cache entry is keyed by: everything known before tracing that changes what
the compile produces (:mod:`airstream.compile_cache`).

- the function: its qualified name and its code (bytecode, constants, names, nested code);
  a bound ``nn.Module`` method also its module's structure (``str(module)``) and each parameter's
  and buffer's name, shape, dtype and device;
- the inputs: each tensor's dtype, device, shape (its rank when compiled ``dynamic``) and
  ``requires_grad``; each plain value (int, float, bool, str, None) itself; any other object its
  type;
- the options: every option of the config, each pass by its identity (:func:`pass_identity`);
- torch's, airstream's and Python's versions, ``$AIRSTREAM_MODE`` and the grad mode.

Source code the function calls is not known before tracing: an entry records the lines it traced
and a load compares them (:func:`airstream.torch_internals.changed_source`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import json
import platform
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from airstream import environment, torch_internals
from airstream.cached_graph import saved_options
from airstream.config import CompilerConfig

__all__ = ["cache_key", "digest", "pass_identity"]

_PLAIN = (int, float, bool, str, type(None))


def digest(value: Any) -> str:
    """A hex sha256 of ``value``'s JSON form (keys sorted)."""
    text = json.dumps(value, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _code_identity(code: types.CodeType) -> list[Any]:
    consts = [
        _code_identity(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts
    ]
    return [
        code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
        code.co_code.hex(),
        consts,
        list(code.co_names),
    ]


def _closure_values(fn: Any) -> list[str]:
    """The plain values a function closes over or defaults to (a regex, a count, ...)."""
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    defaults = list(getattr(fn, "__defaults__", None) or ())
    return [repr(v) if isinstance(v, _PLAIN) else type(v).__qualname__ for v in cells + defaults]


def _filled(cell: Any) -> bool:
    try:
        _ = cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def pass_identity(fn: Callable[..., Any]) -> str:
    """What identifies a pass in a cache key: its ``uuid()`` where it has one (Inductor's
    custom passes), else a digest of its code and of the plain values it closes over (an
    object's: its class's ``__call__`` and its attributes)."""
    uuid = getattr(fn, "uuid", None)
    if callable(uuid):
        value = uuid()
        if value is not None:
            return f"uuid:{value}"
    if isinstance(fn, types.MethodType):
        return "method:" + digest([pass_identity(fn.__func__), type(fn.__self__).__qualname__])
    code = getattr(fn, "__code__", None)
    if code is not None:
        return "code:" + digest([_code_identity(code), _closure_values(fn)])
    call = type(fn).__call__
    attrs = {
        k: (repr(v) if isinstance(v, _PLAIN) else type(v).__qualname__)
        for k, v in sorted(getattr(fn, "__dict__", {}).items())
    }
    inner = pass_identity(call) if hasattr(call, "__code__") else ""
    return "object:" + digest([type(fn).__qualname__, inner, attrs])


def _option_identities(config: CompilerConfig) -> dict[str, Any]:
    options: dict[str, Any] = dict(saved_options(config))
    for path, value in config.as_dict().items():
        if path in options:
            continue
        values = value if isinstance(value, tuple) else (value,)
        options[path] = [pass_identity(v) if callable(v) else repr(v) for v in values]
    return options


def _input(value: Any, dynamic: bool | None) -> Any:
    if isinstance(value, torch.Tensor):
        shape: Any = value.dim() if dynamic else list(value.shape)
        return ["tensor", str(value.dtype), str(value.device), shape, value.requires_grad]
    if isinstance(value, _PLAIN):
        return ["value", repr(value)]
    return ["object", f"{type(value).__module__}.{type(value).__qualname__}"]


def _module(owner: torch.nn.Module) -> dict[str, Any]:
    tensors = [
        [name, list(t.shape), str(t.dtype), str(t.device)]
        for name, t in [*owner.named_parameters(), *owner.named_buffers()]
    ]
    return {
        "type": type(owner).__qualname__,
        "structure": digest(str(owner)),
        "tensors": digest(tensors),
    }


def cache_key(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    config: CompilerConfig,
    dynamic: bool | None,
) -> dict[str, Any]:
    """The fields a cache entry of ``fn`` is keyed by, for these inputs (JSON-able)."""
    func = fn.__func__ if isinstance(fn, types.MethodType) else fn
    leaves = torch_internals.tree_flatten((list(args), dict(kwargs)))[0]
    owner = getattr(fn, "__self__", None)
    return {
        "function": f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}",
        "code": digest(_code_identity(func.__code__)) if hasattr(func, "__code__") else "",
        "module": _module(owner) if isinstance(owner, torch.nn.Module) else None,
        "inputs": digest([_input(v, dynamic) for v in leaves]),
        "dynamic": dynamic,
        "options": digest(_option_identities(config)),
        "torch": torch.__version__,
        "airstream": _airstream_version(),
        "python": platform.python_version(),
        "mode_variable": environment.AIRSTREAM_MODE.read(),
        "grad": torch.is_grad_enabled(),
    }


def _airstream_version() -> str:
    try:
        return importlib.metadata.version("airstream")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def signature_of(fn: Callable[..., Any]) -> str:
    """``fn``'s name and parameters, for messages."""
    try:
        return f"{fn.__qualname__}{inspect.signature(fn)}"
    except (TypeError, ValueError, AttributeError):
        return repr(fn)
