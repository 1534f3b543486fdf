"""Private torch APIs of the on-disk compile cache (:mod:`airstream.caching.compile_cache`):
Dynamo's ahead-of-time compile of a whole function (its bytecode, guards and backend result saved to
one file), AOTAutograd's bundled cache entry (which pickles the backend's ``OutputCode``), FX's
graph pickler, and the record of which source lines a compiled function traced."""

from __future__ import annotations

import dis
import functools
import importlib
import re
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO

import torch
import torch.fx

from airstream.torch_internals.registry import _attr, _feature, _get, _takes

# --- AOTAutograd and Inductor: what a backend returns to be saved -------------------------------


@_feature(
    "output_code",
    "torch._inductor.output_code.OutputCode (__call__, post_compile, prepare_for_serialization)",
    "compile-cache",
    "the base class of a compiled graph AOTAutograd's bundled cache entry can pickle",
)
def _probe_output_code() -> type:
    base = _attr("torch._inductor.output_code:OutputCode")
    for name in ("__call__", "post_compile", "prepare_for_serialization", "set_triton_bundle"):
        if not callable(getattr(base, name, None)):
            raise AttributeError(f"OutputCode has no {name}()")
    return base


def output_code_base() -> type:
    """Inductor's ``OutputCode``: a backend result AOTAutograd can bundle into a cache entry."""
    found: type = _get("output_code")
    return found


@_feature(
    "bundled_autograd_cache",
    "torch._functorch._aot_autograd.autograd_cache.should_bundle_autograd_cache()",
    "compile-cache",
    "knowing that AOTAutograd will pickle this compile's result (an ahead-of-time compile)",
)
def _probe_bundled() -> Callable[[], bool]:
    found: Callable[[], bool] = _attr(
        "torch._functorch._aot_autograd.autograd_cache:should_bundle_autograd_cache"
    )
    return found


def bundling_compile() -> bool:
    """Whether AOTAutograd will save the compiled graph being built (torch's ahead-of-time
    compile sets this): only then does the graph need to be picklable."""
    return bool(_get("bundled_autograd_cache")())


@_feature(
    "graph_pickler",
    "torch.fx._graph_pickler.GraphPickler.dumps(gm, Options(ops_filter=None, "
    "node_metadata_key_filter=...)) / "
    ".loads(data, fake_mode)",
    "compile-cache",
    "saving a graph with its node metadata (fake tensors included)",
)
def _probe_graph_pickler() -> tuple[Any, Any]:
    pickler = _attr("torch.fx._graph_pickler:GraphPickler")
    options = _attr("torch.fx._graph_pickler:Options")
    _takes(options, "ops_filter", "node_metadata_key_filter")
    return pickler, options


_MODULE_STACKS = ("nn_module_stack", "fwd_nn_module_stack")
_UNSAVED_META = frozenset({"source_fn_stack", "fwd_source_fn_stack"})  # callables and classes


def _plain_stack(stack: Mapping[str, Any]) -> dict[str, Any]:
    """A module stack with each module class by its qualified name: what explain, dumps and
    ``module_paths`` read (the paths), in a form pickle can save (a class defined in a function
    cannot be)."""
    plain: dict[str, Any] = {}
    for key, value in stack.items():
        if isinstance(value, tuple) and len(value) == 2:
            kind = value[1]
            name = f"{kind.__module__}.{kind.__qualname__}" if isinstance(kind, type) else kind
            plain[key] = (str(value[0]), str(name))
        else:
            plain[key] = str(value)
    return plain


def dump_graph(gm: torch.fx.GraphModule) -> bytes:
    """``gm`` (its code, nodes and node metadata, module stacks with their classes by name) as
    bytes; the graph itself is left as it was."""
    pickler, options = _get("graph_pickler")
    replaced: list[tuple[torch.fx.Node, str, Any]] = []
    for node in gm.graph.nodes:
        for key in _MODULE_STACKS:
            stack = node.meta.get(key)
            if isinstance(stack, Mapping) and stack:
                replaced.append((node, key, stack))
                node.meta[key] = _plain_stack(stack)
    try:
        data: bytes = pickler.dumps(
            gm,
            options(ops_filter=None, node_metadata_key_filter=lambda k: k not in _UNSAVED_META),
        )
    finally:
        for node, key, stack in replaced:
            node.meta[key] = stack
    return data


def load_graph(data: bytes) -> torch.fx.GraphModule:
    """A graph saved by :func:`dump_graph`; its fake tensors join the fake mode of the compile
    in progress (a new one outside any)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    pickler, _ = _get("graph_pickler")
    fake_mode = detect_fake_mode() or FakeTensorMode(shape_env=ShapeEnv())
    gm = pickler.loads(data, fake_mode)
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(f"the saved graph loaded as {type(gm).__name__}, not a GraphModule")
    return gm


# --- Dynamo: a whole function compiled ahead of time, saved and loaded ------------------------


@_feature(
    "aot_compile",
    "torch.compile(fn, fullgraph=True, options={'guard_filter_fn': "
    "torch.compiler.keep_portable_guards_unsafe}).aot_compile((args, kwargs)) under "
    "torch._dynamo.config.enable_aot_compile and torch.compiler.config.cache_key_tag -> "
    "AOTCompiledFunction (save_compiled_function, guard_check, disable_guard_check, "
    "source_info, _artifacts.runtime_env.bytecode)",
    "compile-cache",
    "compiling a function once and saving its bytecode, guards and compiled graphs",
)
def _probe_aot_compile() -> tuple[type, Any]:
    found: type = _attr("torch._dynamo.aot_compile:AOTCompiledFunction")
    for name in ("save_compiled_function", "guard_check", "disable_guard_check"):
        if not callable(getattr(found, name, None)):
            raise AttributeError(f"AOTCompiledFunction has no {name}()")
    _attr("torch.compiler:keep_portable_guards_unsafe")
    _attr("torch.compiler:load_compiled_function")
    _attr("torch._dynamo.exc:PackageError")
    _attr("torch._dynamo.aot_compile_types:BundledAOTAutogradSerializableCallable")
    dynamo_config = _attr("torch._dynamo:config")
    if not isinstance(dynamo_config.enable_aot_compile, bool):
        raise AttributeError("torch._dynamo.config.enable_aot_compile is not a bool option")
    if not isinstance(torch.compiler.config.cache_key_tag, str):
        raise AttributeError("torch.compiler.config.cache_key_tag is not a str option")
    return found, dynamo_config


def aot_compile(
    fn: Callable[..., Any],
    backend: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    dynamic: bool | None,
    key: str,
) -> Any:
    """``fn`` traced by Dynamo in one graph and compiled by ``backend`` for these inputs, ahead
    of time, for the cache entry of digest ``key``: a callable taking ``fn``'s arguments (a
    bound method's ``self`` first) with guards on the inputs' tensor metadata, their plain
    values and the global state (grad mode, ...)."""
    _, dynamo_config = _get("aot_compile")

    def saving(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        compiled = backend(gm, example_inputs, **kwargs)  # AOTAutograd's bundled result
        return _saved_compile_class()(compiled) if hasattr(compiled, "serialize") else compiled

    with dynamo_config.patch(enable_aot_compile=True):  # off by default before torch 2.15
        compiled = torch.compile(
            fn,
            fullgraph=True,
            dynamic=dynamic,
            backend=saving,
            options={"guard_filter_fn": functools.partial(_guards, closure=_closure_names(fn))},
        )
    # AOTAutograd looks the graph up in its own cache, whose key knows nothing of airstream's
    # options and passes: the entry's key goes into the tag every torch cache key holds, so
    # AOTAutograd serves only what airstream's key says is the same (segment_cache_tag undoes it
    # for Inductor's segment compiles, which a load repeats outside this).
    with torch.compiler.config.patch(cache_key_tag=entry_tag(key)):  # type: ignore[attr-defined]
        try:
            return compiled.aot_compile((tuple(args), dict(kwargs)))  # type: ignore[attr-defined]
        except RuntimeError as exc:
            # torch 2.11 looks each global name the saved bytecode reads up in the traced
            # function's module only, so a builtin it reads (transformers' decorated forwards
            # read `type`) fails the compile: what cannot be saved, as PackageError says.
            if not str(exc).startswith("Missing required external references"):
                raise
            raise package_error()(f"{exc} (torch {torch.__version__})") from exc


_TAG_SEPARATOR = "|airstream-entry:"


def entry_tag(key: str) -> str:
    """The cache-key tag with airstream's entry key ``key`` added to the user's."""
    return f"{segment_cache_tag()}{_TAG_SEPARATOR}{key}"


def segment_cache_tag() -> str:
    """The cache-key tag Inductor's segment compiles use: the user's, without the entry key
    :func:`aot_compile` adds (a segment compiled at load must find what the compile saved)."""
    return str(torch.compiler.config.cache_key_tag).split(_TAG_SEPARATOR)[0]


_VALUE_GUARDS = ("CONSTANT_MATCH", "EQUALS_MATCH")
_PLAIN_VALUES = (bool, int, float, str, type(None))


def _closure_names(fn: Callable[..., Any]) -> frozenset[str]:
    """The free variables of the function Dynamo traces for ``fn`` (a decorator's wrapper
    holds the function it wraps in one)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return frozenset(code.co_freevars) if code is not None else frozenset()


_LOCAL_ROOT = re.compile(r"(?:L\[')?(\w+)")  # a local's guard: "x.attr" (or "L['x'].attr")
# A function's cells and default values: what its source made (the entry records the sources
# it traced), and nothing a loaded function's guards can read through its stand-in inputs.
_FUNCTION_STATE = (".__closure__", ".__defaults__", ".__kwdefaults__")


def _guards(entries: Sequence[Any], closure: frozenset[str] = frozenset()) -> list[bool]:
    """The guards a saved function keeps: torch's portable ones (tensor metadata, global
    state, dynamic shapes) and those on plain values (a flag, a count: the trace took one
    branch for them), in the inputs, module attributes or globals; not those on an object's
    identity or type, which name objects of the process that compiled, nor those on the traced
    function's ``closure`` or on any function's cells and defaults (a loaded function's guards
    cannot read them, and they belong to the code the entry was made for, as its sources do:
    a decorator's wrapper holds the method it wraps in a cell)."""
    portable = torch.compiler.keep_portable_guards_unsafe(entries)
    kept = []
    for keep, e in zip(portable, entries, strict=True):
        name = str(e.name)
        root = _LOCAL_ROOT.match(name)
        if (not e.is_global and root is not None and root.group(1) in closure) or any(
            part in name for part in _FUNCTION_STATE
        ):
            kept.append(False)
            continue
        kept.append(keep or (e.guard_type in _VALUE_GUARDS and isinstance(e.value, _PLAIN_VALUES)))
    return kept


def package_error() -> type[Exception]:
    """The exception torch raises for what an ahead-of-time compile cannot save (a guard on an
    object's identity, a class defined in a function)."""
    found: type[Exception] = _attr("torch._dynamo.exc:PackageError")
    return found


@functools.cache
def _saved_compile_class() -> type:
    """torch's wrapper of an AOTAutograd bundled result as something Dynamo's ahead-of-time
    compile can save (torch 2.11 wraps only Inductor's and its own AOTAutograd backends'); its
    ``serialize`` is hidden so that torch 2.15, which wraps any result that has one, does not
    wrap it twice."""
    base = _attr("torch._dynamo.aot_compile_types:BundledAOTAutogradSerializableCallable")
    namespace = {"__module__": __name__, "__qualname__": "SavedCompile", "serialize": None}
    return type("SavedCompile", (base,), namespace)


def __getattr__(name: str) -> Any:
    if name == "SavedCompile":  # what pickle looks up when it loads a saved function
        return _saved_compile_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def save_compiled(compiled: Any, path: str, external: Mapping[str, Any] | None = None) -> None:
    """Write an ahead-of-time compiled function to ``path``; the objects of ``external`` are
    saved as their names, for :func:`load_compiled` to be given again."""
    compiled.save_compiled_function(path, external_data=dict(external or {}))


def load_compiled(
    file: BinaryIO, f_globals: Mapping[str, Any], external: Mapping[str, Any] | None = None
) -> Any:
    """A function saved by :func:`save_compiled`, its bytecode bound to ``f_globals`` and the
    names saved in place of objects bound to ``external``'s."""
    _get("aot_compile")
    return torch.compiler.load_compiled_function(
        file,  # type: ignore[arg-type]
        f_globals=dict(f_globals),
        external_data=dict(external or {}),
    )


def guards_pass(compiled: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether the inputs meet the guards ``compiled`` was saved with."""
    return bool(compiled.guard_check(*args, **kwargs))


def skip_guard_check(compiled: Any) -> None:
    """Have ``compiled`` skip its own guard check (the caller checks with :func:`guards_pass`)."""
    compiled.disable_guard_check()


def takes_self(compiled: Any, method: Any) -> bool:
    """Whether ``compiled`` (from a bound method) takes the method's ``self`` first: it does when
    Dynamo traced the method's own function, not a wrapper holding ``self`` itself."""
    func = getattr(method, "__func__", None)
    code = compiled._artifacts.original_code
    own = getattr(func, "__code__", None)
    return own is not None and (code.co_name, code.co_code) == (own.co_name, own.co_code)


def _code_objects(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def global_names(compiled: Any) -> set[str]:
    """The global names the compiled function's bytecode reads."""
    bytecode = compiled._artifacts.runtime_env.bytecode
    return {
        str(ins.argval)
        for code in _code_objects(bytecode)
        for ins in dis.get_instructions(code)
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval
    }


@_feature(
    "traced_sources",
    "AOTCompiledFunction.source_info.inlined_sources (module, firstlineno, lastlineno, "
    "checksum) and torch._dynamo.package._hash_sourcelines",
    "compile-cache",
    "telling that source code a saved function traced has changed since",
)
def _probe_traced_sources() -> Callable[..., str]:
    inlined = _attr("torch._dynamo.package:InlinedSource")
    fields = getattr(inlined, "__dataclass_fields__", {})
    missing = {"module", "firstlineno", "lastlineno", "checksum"} - set(fields)
    if missing:
        raise AttributeError(f"InlinedSource has no {sorted(missing)}")
    found: Callable[..., str] = _attr("torch._dynamo.package:_hash_sourcelines")
    return found


def traced_sources(compiled: Any) -> list[tuple[str, int, int, str]]:
    """The source lines a compiled function traced: (module, first line, last line, checksum)."""
    _get("traced_sources")
    info = compiled.source_info
    info = info() if callable(info) else info  # a method on some releases, a property on others
    return sorted((s.module, s.firstlineno, s.lastlineno, s.checksum) for s in info.inlined_sources)


def changed_source(sources: Sequence[tuple[str, int, int, str]]) -> str | None:
    """The first of ``sources`` whose lines are not what they were, as ``module:first-last``
    (None when all are the same)."""
    hash_lines = _get("traced_sources")
    for module_name, first, last, checksum in sources:
        try:
            module = importlib.import_module(module_name)
            same = hash_lines(module, first, last) == checksum
        except (ImportError, OSError, TypeError):
            same = False
        if not same:
            return f"{module_name}:{first}-{last}"
    return None
