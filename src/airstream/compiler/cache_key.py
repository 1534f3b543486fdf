"""What a compile-cache entry is keyed by: everything known before tracing that changes what
the compile produces (:mod:`airstream.caching.compile_cache`).

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

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import pickle
import platform
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from airstream import torch_internals
from airstream.machine import environment
from airstream.machine.calibration import calibrate_for, stored_costs
from airstream.options.config import CompilerConfig

__all__ = [
    "airstream_version",
    "cache_key",
    "calibration_digest",
    "costs_field",
    "digest",
    "option_identities",
    "pass_identity",
    "ranks",
    "saved_options",
]

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


def _closure_values(fn: Any) -> list[Any]:
    """What a function closes over or defaults to (a regex, a count, a module, ...)."""
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if _filled(c)]
    defaults = list(getattr(fn, "__defaults__", None) or ())
    return [_value(v) for v in cells + defaults]


def _value(value: Any) -> Any:
    """A value as a key sees it: plain values themselves, functions and classes by name, a
    module by :func:`_module`, a tensor by its metadata, anything else by its type."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, torch.nn.Module):
        return _module(value)
    if isinstance(value, torch.Tensor):
        return ["tensor", str(value.dtype), list(value.shape), str(value.device)]
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
        return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
    if isinstance(value, functools.partial):
        return [
            "partial",
            _value(value.func),
            [_value(a) for a in value.args],
            {k: _value(v) for k, v in sorted(value.keywords.items())},
        ]
    if isinstance(value, (tuple, list)) and len(value) <= 64:
        return [_value(v) for v in value]
    name = f"{type(value).__module__}.{type(value).__qualname__}"
    if getattr(type(value), "key_by_type_only", False):  # its attributes are process state
        return name
    # an object's public plain attributes, one level down (a model's config: flags a trace reads)
    plain = {
        k: repr(v)
        for k, v in sorted(getattr(value, "__dict__", {}).items())
        if isinstance(v, _PLAIN) and not k.startswith("_")
    }
    return [name, plain] if plain else name


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
        owner = fn.__self__
        return "method:" + digest([pass_identity(fn.__func__), _attributes(owner)])
    if isinstance(fn, functools.partial):
        return "partial:" + digest([_value(fn), pass_identity(fn.func)])
    code = getattr(fn, "__code__", None)
    if code is not None:
        return "code:" + digest([_code_identity(code), _closure_values(fn)])
    call = type(fn).__call__
    inner = pass_identity(call) if hasattr(call, "__code__") else _value(fn)
    return "object:" + digest([type(fn).__qualname__, inner, _attributes(fn)])


def _attributes(owner: Any) -> dict[str, Any]:
    """An object's own attributes as a key sees them (:func:`_value`)."""
    return {k: _value(v) for k, v in sorted(getattr(owner, "__dict__", {}).items())}


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


def option_identities(config: CompilerConfig) -> dict[str, Any]:
    """Every option of ``config`` as a key sees it: the plain ones themselves, each pass (and
    any other callable) by :func:`pass_identity`."""
    options: dict[str, Any] = dict(saved_options(config))
    for path, value in config.as_dict().items():
        if path in options:
            continue
        values = value if isinstance(value, tuple) else (value,)
        options[path] = [pass_identity(v) if callable(v) else repr(v) for v in values]
    return options


def _input(value: Any, dynamic: bool | None) -> Any:
    if isinstance(value, torch.Tensor):
        # dynamic: the rank, and which sizes are 0 or 1 (torch specializes those)
        shape: Any = [min(d, 2) for d in value.shape] if dynamic else list(value.shape)
        strides = None if dynamic else list(value.stride())
        return ["tensor", str(value.dtype), str(value.device), shape, strides, value.requires_grad]
    if isinstance(value, _PLAIN):
        return ["value", repr(value)]
    return ["object", f"{type(value).__module__}.{type(value).__qualname__}"]


def _module(owner: torch.nn.Module) -> dict[str, Any]:
    """A module as a key sees it: its printed structure, each parameter's and buffer's
    metadata, and every submodule's other attributes (``training``, a flag, a function chosen
    at construction: what the trace may have read)."""
    tensors = [
        [name, list(t.shape), str(t.dtype), str(t.device)]
        for name, t in [*owner.named_parameters(), *owner.named_buffers()]
    ]
    attributes = [
        [
            name,
            type(sub).__qualname__,
            {k: _value(v) for k, v in sorted(torch_internals.module_attributes(sub).items())},
        ]
        for name, sub in owner.named_modules()
    ]
    return {
        "type": type(owner).__qualname__,
        "structure": digest(str(owner)),
        "tensors": digest(tensors),
        "attributes": digest(attributes),
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
    leaves, spec = torch_internals.tree_flatten((list(args), dict(kwargs)))
    owner = getattr(fn, "__self__", None)
    return {
        "function": f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}",
        "code": digest(_code_identity(func.__code__)) if hasattr(func, "__code__") else "",
        "closure": digest(_closure_values(func)),
        "module": _module(owner) if isinstance(owner, torch.nn.Module) else None,
        "inputs": digest([str(spec), [_input(v, dynamic) for v in leaves]]),
        "dynamic": dynamic,
        "options": digest(option_identities(config)),
        "torch": torch.__version__,
        "airstream": airstream_version(),
        "python": platform.python_version(),
        "mode_variable": environment.AIRSTREAM_MODE.read(),
        "costs": costs_field(config),
        "ranks": ranks(),
        "grad": torch.is_grad_enabled(),
    }


def costs_field(config: CompilerConfig) -> list[Any]:
    """What a key holds of the stream costs ``config``'s passes decide with:
    ``$AIRSTREAM_COSTS`` and the measured figures, measured first where a pass will measure
    them in this compile (:func:`airstream.machine.calibration.calibrate_for`)."""
    values = config.as_dict().values()
    calibrate_for(v for value in values for v in (value if isinstance(value, tuple) else (value,)))
    return [environment.AIRSTREAM_COSTS.read(), calibration_digest()]


def calibration_digest() -> str | None:
    """A digest of the measured stream costs auto_streams decides with here (None: not
    measured); figures stored for another thread count or machine do not change it."""
    costs = stored_costs()
    return None if costs is None else digest(dataclasses.asdict(costs))


def ranks() -> list[int] | None:
    """This process's rank and the world size, in a distributed job (each rank compiles its
    own graphs: collectives name their group)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return [dist.get_rank(), dist.get_world_size()]
    return None


@functools.cache
def airstream_version() -> str:
    """airstream's version and a digest of its source files (an editable install changes
    without its version number changing; the passes and the planner are in them)."""
    try:
        version = importlib.metadata.version("airstream")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "unknown"
    package = Path(__file__).resolve().parent.parent  # the whole package, not this folder
    sources = hashlib.sha256()
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".c") and path.is_file():
            sources.update(str(path.relative_to(package)).encode())
            sources.update(path.read_bytes())
    return f"{version}+{sources.hexdigest()[:16]}"
