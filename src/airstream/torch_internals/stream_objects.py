"""Dynamo's registry of the stream and event objects a graph uses: read while a graph compiles
(each object, the source it is read from, whether it is the caller's current stream), read per
call at run time, and added to by passes writing PyTorch's stream IR. The IR itself (annotations,
the ``streams`` ops) is ``torch_internals.streams``.
"""

from __future__ import annotations

import importlib
import re
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from airstream.torch_internals.registry import _attr, _feature, probe
from airstream.torch_internals.streams import _REGISTRY, _ir

__all__ = [
    "TorchStreamObject",
    "torch_stream_object_at_run_time",
    "torch_stream_objects",
    "new_torch_event",
    "new_torch_stream",
    "readable_name",
    "register_current_stream",
]


@dataclass(frozen=True)
class TorchStreamObject:
    """One stream or event in Dynamo's registry while a graph compiles: its ``index``, a weak
    reference to it, the expression Dynamo reads it from (``L['self'].alt_stream``; None for an
    object the compiled code creates) and whether it is the caller's current stream."""

    index: int
    ref: weakref.ReferenceType[Any]
    source: str | None
    current: bool

    @property
    def value(self) -> Any:
        return self.ref()


def _entries(table: dict[int, Any] | list[Any]) -> Iterator[tuple[int, Any]]:
    return iter(table.items()) if isinstance(table, dict) else enumerate(table)


def _source_of(constructor: Any) -> Any:
    """The Dynamo Source a registry entry is read from (a closure cell of its bytecode
    constructor), or None for an object the compiled code constructs."""
    for cell in getattr(constructor, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if hasattr(value, "name") and type(value).__name__.endswith("Source"):
            return value
    return None


def _builds_current_stream(constructor: Any, depth: int = 3) -> bool:
    """A registry entry Dynamo's ``get_current_stream`` made (its bytecode reads the caller's
    current stream, through a constructor nested in closures)."""
    code = getattr(constructor, "__code__", None)
    if code is not None and "_codegen_current_stream" in code.co_names:
        return True
    if depth == 0:
        return False
    for cell in getattr(constructor, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:
            continue
        if callable(inner) and _builds_current_stream(inner, depth - 1):
            return True
    return False


def _source_name(source: Any) -> str | None:
    if source is None:
        return None
    name = source.name() if callable(source.name) else source.name
    return str(name)


def torch_stream_objects() -> dict[int, TorchStreamObject]:
    """Dynamo's registry as it stands while a graph compiles: every stream and event by index."""
    registry = _ir().registry
    constructors = dict(_entries(registry.index_to_bytecode_constructor))
    found = {}
    for index, ref in _entries(registry.index_to_external_object_weakref):
        value = ref()
        if not isinstance(value, (torch.Stream, torch.Event)) and not _stream_like(value):
            continue
        constructor = constructors.get(index)
        source = _source_of(constructor)
        current = (
            source is not None and type(source).__name__ == "CurrentStreamSource"
        ) or _builds_current_stream(constructor)
        found[index] = TorchStreamObject(index, ref, _source_name(source), current)
    return found


def _stream_like(value: Any) -> bool:
    """A stream or event of a device module that does not subclass torch.Stream/torch.Event."""
    return type(value).__name__ in ("Stream", "Event", "ExternalStream")


def torch_stream_object_at_run_time(index: int) -> Any:
    """The object at ``index`` for the call in progress (the graph's bytecode stores the
    caller's objects before each call)."""
    return _ir().getter(index)


def _register_new(kind: str, device: torch.device) -> int:
    """A new stream or event on ``device``, registered as an object the compiled code creates:
    Dynamo's bytecode builds it again, on the same device, before every call. (torch's own
    ``new_stream()`` rebuilds it without the device, on the default accelerator.)"""
    module = importlib.import_module("torch._dynamo.variables.streams")
    registry = importlib.import_module(_REGISTRY)
    variables = importlib.import_module("torch._dynamo.variables")
    args = variables.TupleVariable([variables.ConstantVariable.create(str(device))])
    kwargs = variables.ConstDictVariable({})
    if kind == "stream":
        value: Any = torch.Stream(str(device))
        build = module.StreamVariable.make_construct_in_graph_stream_fn(args, kwargs)
    else:
        value = torch.Event(str(device))
        build = module.EventVariable.make_construct_in_graph_event_fn(args, kwargs)
    index: int = registry.register_graph_created_object(value, build)
    return index


def register_current_stream(
    device: torch.device, cpu_stream: Any = None, cpu_home: tuple[str, str] | None = None
) -> int:
    """The registry index of the caller's current stream on ``device``, registered now (the
    graph's bytecode reads it before every call). CPU has no current stream in torch; there it
    is ``cpu_stream``, the object the bytecode loads as ``cpu_home`` (module, attribute):
    airstream's object for the main stream (``airstream.current_stream("cpu")``)."""
    module = importlib.import_module("torch._dynamo.variables.streams")
    if device.type != "cpu":
        index: int = module.get_current_stream(device)
        return index
    if cpu_stream is None or cpu_home is None:
        raise ValueError("register_current_stream on CPU needs cpu_stream and cpu_home")
    registry = importlib.import_module(_REGISTRY)
    call = _attr("torch._dynamo.bytecode_transformation:create_call_function")
    home, name = cpu_home

    def build(index: int, codegen: Any) -> None:  # stash_graph_created_object(<the object>)
        codegen.add_push_null(
            lambda: codegen.load_import_from(registry.__name__, "stash_graph_created_object")
        )
        codegen.load_import_from(home, name)
        codegen.extend_output(call(1, False))

    found: int = registry.register_graph_created_object(cpu_stream, build)
    return found


def new_torch_stream(device: torch.device) -> int:
    """A new stream on ``device`` for a pass writing native form: its registry index, valid for
    the graph being compiled (only while Dynamo compiles one)."""
    return _register_new("stream", device)


def new_torch_event(device: torch.device) -> int:
    """A new event on ``device``, registered like :func:`new_torch_stream`."""
    return _register_new("event", device)


def readable_name(source: str | None) -> str | None:
    """The variable a Dynamo source expression ends in: ``L['self'].alt_stream`` -> ``alt_stream``,
    ``G['s']`` -> ``s``; None when there is none."""
    if not source:
        return None
    match = re.search(r"(?:\.|\[')([A-Za-z_]\w*)'?\]?$", source)
    return match.group(1) if match else None


_RUNTIME_WRAPPERS = "torch._functorch._aot_autograd.runtime_wrappers"


@_feature(
    "backward_snapshot",
    f"{_RUNTIME_WRAPPERS}.index_to_external_object_weakref (the registry list AOTAutograd's "
    f"backward restores, imported once) and {_REGISTRY}.store_user_object_weakrefs",
    "diagnostics",
    "backward graphs of models with torch.Stream blocks in a process that compiles several "
    "(torch 2.15's registry snapshot detached at `import airstream`)",
)
def _probe_backward_snapshot() -> str:
    """torch 2.15's AOTAutograd snapshots Dynamo's registry at each forward and restores it in
    backward, reading it through a name imported once (``runtime_wrappers``), while each graph's
    bytecode binds the registry's module name to a new list: the snapshot keeps reading the
    first list ever filled, the objects of the first frame with streams compiled in the process.
    Once one of those is gone and a later one lives, every later backward of any model fails
    (``Index past the end of index_to_user_object_weakref``). Binding the name to a fresh list
    before any frame fills it leaves the first list empty for good: the restore does nothing
    (it restored the wrong objects anyway), and airstream's own backward graphs find their
    objects without it. Run at ``import airstream``; idempotent (doctor runs it again). Raises
    where the first list was filled before airstream was imported."""
    registry = importlib.import_module(_REGISTRY)
    try:
        wrappers = importlib.import_module(_RUNTIME_WRAPPERS)
    except ImportError:
        return "not needed: this torch has no AOTAutograd runtime wrappers module"
    held = getattr(wrappers, "index_to_external_object_weakref", None)
    if not isinstance(held, list):
        return "not needed: this torch's backward restores no registry snapshot"
    if held:
        raise RuntimeError(
            "a frame with torch.Stream objects was compiled before `import airstream`, so "
            "AOTAutograd's backward keeps restoring that frame's objects; backward graphs of "
            "later models with streams may fail with 'Index past the end'. Import airstream "
            "before compiling anything"
        )
    if held is getattr(registry, "index_to_external_object_weakref", None):
        registry.store_user_object_weakrefs()  # a fresh list: the snapshot's stays empty
    return "detached"


_AT_IMPORT = probe("backward_snapshot")  # doctor reports it again
