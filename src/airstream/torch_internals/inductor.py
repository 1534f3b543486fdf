"""Private Inductor APIs behind ``mode="max-autotune"``: compiling a segment, its decompositions,
output strides, the FX graph cache counter and the C++ compiler lookup."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import sympy  # type: ignore[import-untyped]
import torch
import torch.autograd.profiler
import torch.fx

from airstream.torch_internals.caching import segment_cache_tag
from airstream.torch_internals.core import OpOverload
from airstream.torch_internals.kernel_gil import kernels_without_gil
from airstream.torch_internals.registry import (
    _attr,
    _feature,
    _get,
    _module_reads,
    _optional,
    _takes,
)
from airstream.torch_internals.tools import size_hint

# --- max-autotune: Inductor -------------------------------------------------------------------


@_feature(
    "inductor_compile",
    "torch._inductor.compile_fx.compile_fx_inner(is_inference, is_backward), "
    "torch._inductor.config.cpp.threads, .triton.cudagraphs and .fx_graph_cache, "
    "torch._functorch.config.bundled_autograd_cache, "
    "torch._guards.TracingContext/tracing/report_output_strides and the compiled "
    "graph's source_code",
    "max-autotune",
    'compiling each segment with Inductor in mode="max-autotune"',
)
def _probe_inductor_compile() -> tuple[Callable[..., Any], Any, Any, Any, Any]:
    compile_inner = _attr("torch._inductor.compile_fx:compile_fx_inner")
    _takes(compile_inner, "is_inference", "is_backward")
    config = _attr("torch._inductor:config")
    if not isinstance(config.cpp.threads, int):
        raise AttributeError("torch._inductor.config.cpp.threads is not an int option")
    if not isinstance(config.triton.cudagraphs, bool):
        raise AttributeError("torch._inductor.config.triton.cudagraphs is not a bool option")
    if not isinstance(config.fx_graph_cache, bool):
        raise AttributeError("torch._inductor.config.fx_graph_cache is not a bool option")
    context, tracing = _attr("torch._guards:TracingContext"), _attr("torch._guards:tracing")
    if not callable(getattr(context, "report_output_strides", None)):
        raise AttributeError("TracingContext has no report_output_strides")
    output_code = _attr("torch._inductor.output_code:CompiledFxGraph")
    if "source_code" not in getattr(output_code, "__dataclass_fields__", {}):
        raise AttributeError("CompiledFxGraph has no source_code field")
    functorch = _attr("torch._functorch:config")
    if not isinstance(functorch.bundled_autograd_cache, bool):
        raise AttributeError("torch._functorch.config.bundled_autograd_cache is not a bool option")
    return compile_inner, config, context, tracing, functorch


@_feature(
    "inductor_decompositions",
    "torch._inductor.decomposition.select_decomp_table and node.meta['original_aten']",
    "max-autotune",
    "decomposing a segment the way Inductor expects, with descriptive kernel names",
)
def _probe_inductor_decompositions() -> Callable[[], Any]:
    select = _attr("torch._inductor.decomposition:select_decomp_table")
    if not select():
        raise LookupError("select_decomp_table() returned an empty table")
    _module_reads("torch.fx.experimental.proxy_tensor", "original_aten")
    return select


@_feature(
    "inductor_output_strides",
    "Inductor's output-node meta keys 'original_output_strides' and 'user_visible_output_idxs'",
    "max-autotune",
    "making every segment return its outputs in the strides its readers were compiled for",
)
def _probe_inductor_output_strides() -> None:
    _module_reads(
        "torch._inductor.compile_fx", "original_output_strides", "user_visible_output_idxs"
    )
    _module_reads("torch._inductor.graph", "original_output_strides", "user_visible_output_idxs")


@_feature(
    "fxgraph_cache_counter",
    "torch._dynamo.utils.counters['inductor']['fxgraph_cache_hit']",
    "diagnostics",
    "reporting whether a segment came from Inductor's FX graph cache",
)
def _probe_fxgraph_cache_counter() -> Any:
    counters = _attr("torch._dynamo.utils:counters")
    _module_reads("torch._inductor.codecache", "fxgraph_cache_hit")
    return counters


def _compound_symint(value: Any) -> bool:
    """A symbolic int input that is an expression of several sizes (``s0*s1``), not one."""
    return isinstance(value, torch.SymInt) and not value.node.expr.is_symbol


@_feature(
    "inductor_input_symbols",
    "torch.fx.experimental.symbolic_shapes._get_placeholder_expr and free_symbols",
    "max-autotune",
    "giving each segment the size symbols its code uses (dynamic shapes)",
)
def _probe_inductor_input_symbols() -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    placeholder = _attr("torch.fx.experimental.symbolic_shapes:_get_placeholder_expr")
    lowering = _attr("torch._inductor.graph:GraphLowering")
    try:  # Inductor binds a symbolic int input with it (a torch without sources passes)
        source = inspect.getsource(lowering.placeholder)
    except (OSError, TypeError):
        source = "_get_placeholder_expr"
    if "_get_placeholder_expr" not in source:
        raise LookupError("GraphLowering.placeholder no longer binds _get_placeholder_expr")
    return placeholder, _attr("torch.fx.experimental.symbolic_shapes:free_symbols")


def plain_symbol(value: Any) -> Any:
    """The sympy symbol a symbolic int is (``s0``, after the shape environment's replacements),
    or None (an int, an expression, no int)."""
    if isinstance(value, torch.SymInt) and value.node.expr.is_symbol:
        return value.node.expr
    return None


def multiple_of(size: Any, unit: Any) -> int | None:
    """``size / unit`` where it is a positive whole number, for ints and symbolic ints alike
    (``2*s0`` over ``s0`` is 2), else None."""
    if isinstance(size, torch.SymInt) and isinstance(unit, torch.SymInt):
        ratio = size.node.expr / unit.node.expr
        return int(ratio) if ratio.is_Integer and int(ratio) > 0 else None
    if isinstance(size, torch.SymInt) or isinstance(unit, torch.SymInt):
        return None
    if isinstance(size, int) and isinstance(unit, int) and unit > 0 and size > 0:
        return size // unit if size % unit == 0 else None
    return None


def size_at(value: Any, assigned: Mapping[Any, int]) -> int:
    """A size's value where the symbols in ``assigned`` (sympy symbols) take the values given
    and every other symbol its example value (no guard is installed): the sizes a split graph
    would see at another token count. Ints come back as they are."""
    if not isinstance(value, torch.SymInt):
        return int(value)
    given = {s: sympy.Integer(v) for s, v in assigned.items()}
    expr = sympy.sympify(value.node.expr).xreplace(given)
    env = value.node.shape_env
    # the example values: ``backed_var_to_val`` from torch 2.13, ``var_to_val`` before
    examples = getattr(env, "backed_var_to_val", None) or getattr(env, "var_to_val", {})
    rest = {s: sympy.sympify(examples[s]) for s in expr.free_symbols if s in examples}
    found = sympy.sympify(expr.xreplace(rest))
    if not found.is_number:
        return size_hint(value)
    return int(found)


def unbound_symbols(inputs: Sequence[Any], values: Sequence[Any]) -> set[Any]:
    """The size symbols ``values`` (fake tensors, symbolic ints) use that a graph with
    ``inputs`` as its example inputs would not give Inductor. Inductor reads a symbol from a
    tensor input's size or stride that is that symbol, and from a symbolic int input the symbol
    it was made as: where the shape environment has since found that symbol equal to another
    (``s27`` is ``s11``), its code uses the other, which such an input does not give."""
    placeholder_expr, free_symbols = _get("inductor_input_symbols")
    bound: set[Any] = set()
    for value in inputs:
        if isinstance(value, torch.Tensor):
            for dim in (*value.shape, *value.stride()):
                symbol = plain_symbol(dim)
                if symbol is not None:
                    bound.add(symbol)
        elif isinstance(value, torch.SymInt):
            bound.add(placeholder_expr(value.node))
    used: set[Any] = set()
    for value in values:
        items = value if isinstance(value, (tuple, list)) else (value,)
        for item in items:
            if isinstance(item, (torch.Tensor, torch.SymInt)):
                used |= set(free_symbols(item))
    return used - bound


def binds_symbol(value: Any, symbol: Any) -> bool:
    """Whether ``value``, as a graph input, gives Inductor ``symbol`` (see unbound_symbols)."""
    if isinstance(value, torch.SymInt):
        placeholder_expr, _ = _get("inductor_input_symbols")
        return bool(placeholder_expr(value.node) == symbol)
    if isinstance(value, torch.Tensor):
        return any(plain_symbol(d) == symbol for d in (*value.shape, *value.stride()))
    return False


@contextlib.contextmanager
def _inductor_context(
    fake_mode: Any, threads: int, graph_cache: bool = True, release_gil: bool = True
) -> Iterator[None]:
    _, config, context, tracing, functorch = _get("inductor_compile")
    # A segment is one step of airstream's plan: Inductor must not wrap it in a CUDA graph of its
    # own (torch.compile(mode="reduce-overhead") or a user's config turns that on globally).
    patches: dict[str, Any] = {"triton.cudagraphs": False}
    if threads > 0:
        patches["cpp.threads"] = threads
    if not graph_cache:
        patches["fx_graph_cache"] = False
    # An ahead-of-time compile (airstream.cache_compile) bundles airstream's graphs itself, and
    # its bundling switch turns Inductor's FX graph cache off: each segment must still go to that
    # cache, where loading the saved function finds it. Loading sets enable_autograd_for_aot
    # (for Inductor's own saved graphs), which is in the FX cache's key: a segment compiled at
    # load must have the key it was saved under.
    bundling = functorch.patch(bundled_autograd_cache=False)
    if hasattr(config, "enable_autograd_for_aot"):
        patches["enable_autograd_for_aot"] = False
    tag = torch.compiler.config.patch(cache_key_tag=segment_cache_tag())  # type: ignore[attr-defined]
    # A segment's CPU kernels let go of the GIL while they run, as ATen's ops do; one that may
    # run beside another stream's work (threads > 0) warns where this torch's binding is unknown.
    released = kernels_without_gil(warn=threads > 0) if release_gil else contextlib.nullcontext()
    with tracing(context(fake_mode)), config.patch(patches), bundling, tag, released:
        yield


@dataclasses.dataclass(frozen=True)
class InductorCompiled:
    """A graph Inductor compiled: the boxed callable (takes a list of inputs), its generated
    source (``""`` if it has none) and the strides it returns each output in, as Inductor
    reports them (at the example sizes; None: not a tensor, or not reported)."""

    call: Callable[[list[Any]], Any]
    source: str
    output_strides: tuple[tuple[int, ...] | None, ...] | None


def inductor_compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fake_mode: Any,
    graph_kind: str,
    threads: int = 0,
    release_gil: bool = True,
) -> InductorCompiled:
    """Compile a decomposed aten graph with Inductor, in a tracing context of ``fake_mode``;
    ``threads`` > 0 fixes generated CPU kernels' intra-op threads; ``release_gil``: its CPU
    kernels let go of the GIL while they run (``kernel_gil.py``)."""
    compile_inner, _, context, _, _ = _get("inductor_compile")
    # The FX graph cache checks an entry's shape guards by the Dynamo sources of the graph's
    # symbolic inputs; a segment input like ``s0*s1`` (an int the model computed) is no source,
    # and the lookup fails with a KeyError on the source's name: compile such segments uncached.
    cacheable = not any(_compound_symint(v) for v in example_inputs)
    with (
        _inductor_context(fake_mode, threads, graph_cache=cacheable, release_gil=release_gil),
        context.report_output_strides() as reported,
    ):
        compiled = compile_inner(
            gm,
            list(example_inputs),
            is_inference=graph_kind == "inference",
            is_backward=graph_kind == "backward",
        )
    strides = None
    if reported is not None and len(reported) == len(_output_args(gm)):
        strides = tuple(_concrete(s) for s in reported)
    return InductorCompiled(compiled, getattr(compiled, "source_code", "") or "", strides)


def _concrete(stride: Sequence[Any] | None) -> tuple[int, ...] | None:
    """A reported stride at the example sizes: Inductor evaluates its symbolic strides with
    the shape environment's values, which may come back as sympy numbers; None where one is not
    a number."""
    if stride is None:
        return None
    values = []
    for x in stride:
        if isinstance(x, torch.SymInt):
            values.append(size_hint(x))
            continue
        try:
            values.append(int(x))
        except (TypeError, ValueError):
            return None
    return tuple(values)


def _output_args(gm: torch.fx.GraphModule) -> Sequence[Any]:
    (output,) = gm.graph.find_nodes(op="output")
    args = output.args[0]
    return args if isinstance(args, (tuple, list)) else (args,)


def inductor_decomposition_table() -> Mapping[Any, Callable[..., Any]]:
    """The decompositions Inductor applies before lowering."""
    return _get("inductor_decompositions")()


def tag_original_aten(gm: torch.fx.GraphModule) -> None:
    """Record each op node's aten op as Inductor's kernel-naming metadata, if not set."""
    _get("inductor_decompositions")
    for node in gm.graph.nodes:
        if isinstance(node.target, OpOverload):
            node.meta.setdefault("original_aten", node.target)


def pin_output_strides(output: torch.fx.Node, strides: Sequence[Any]) -> None:
    """Make Inductor return each output in ``strides`` (None: not a tensor), as it does for a
    graph's user-visible outputs, instead of a layout it prefers."""
    _get("inductor_output_strides")
    output.meta["original_output_strides"] = list(strides)
    output.meta["user_visible_output_idxs"] = [i for i, s in enumerate(strides) if s is not None]


def fxgraph_cache_hits() -> int | None:
    """How many times Inductor's FX graph cache has hit in this process (None: unknown, after
    one warning, on a torch without the counter)."""
    counters = _optional("fxgraph_cache_counter")
    return None if counters is None else counters["inductor"]["fxgraph_cache_hit"]


@_feature(
    "inductor_cpp_compiler",
    "torch._inductor.cpp_builder.get_cpp_compiler",
    "diagnostics",
    "finding the C++ compiler Inductor builds CPU kernels with (`airstream doctor`)",
)
def _probe_inductor_cpp_compiler() -> Callable[[], str]:
    return _attr("torch._inductor.cpp_builder:get_cpp_compiler")


def inductor_cpp_compiler() -> str:
    """The C++ compiler command Inductor uses for CPU kernels (``g++``, ``$CXX``, ...)."""
    return _get("inductor_cpp_compiler")()
