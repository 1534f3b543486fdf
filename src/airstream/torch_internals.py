"""Every private torch API airstream relies on, behind one boundary, each with a probe.

torch's private modules (``torch._dynamo``, ``torch._inductor``, ``torch._functorch``,
``torch._C``, ``torch.testing._internal``, ...), private attributes (``OpOverload._schema``) and
the node-meta keys torch's own passes write or read (the partitioner's tag, Inductor's output
strides) change between releases without notice. No other airstream module touches them
(``tests/test_torch_internals.py`` scans the source tree for that); they call the accessors here.

Each private API is a :class:`Feature`: a name, the group of airstream functionality that needs it,
what it is used for, and a probe that checks it exists with the shape airstream relies on (an
attribute, a keyword argument, a meta key still read by the torch module that consumes it). A
failing probe raises :class:`~airstream.errors.TorchSupportError` naming the feature, this torch and
the supported range, the first time its group is needed, never a silent fallback:

- import time: the handful of names airstream binds when it is imported (op classes, fake tensors,
  the profiler flag its hot path reads);
- ``core``: at the first compile, all of them at once (one error lists every missing one);
- ``max-autotune``, ``profiler``, ``explain``, ``collectives``, ``selftest``, ``testing``: the first
  time that part is used.

``probe_all()`` runs every probe (``airstream doctor`` prints the result; the test suite requires
all of them on every supported torch).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.profiler
import torch.fx

from airstream.errors import TorchSupportError

__all__ = [
    "COLLECTIVE_NAMESPACES",
    "FEATURES",
    "GROUPS",
    "PRIVATE_ATTRIBUTES",
    "SUPPORTED_TORCH",
    "TESTED_TORCH",
    "TORCH_META_KEYS",
    "Feature",
    "FakeTensor",
    "FakeTensorMode",
    "OpOverload",
    "OpOverloadPacket",
    "OperatorBase",
    "ProbeResult",
    "aot_autograd",
    "aot_eager",
    "aot_module_simplified",
    "collective_op_name",
    "compile_fx",
    "detect_fake_mode",
    "dynamo_skip",
    "dynamo_unsupported",
    "eval_frame_callback_getter",
    "fake_store",
    "functional_collectives",
    "fxgraph_cache_hits",
    "dynamo_graph_break",
    "inductor_compile",
    "inductor_cpp_compiler",
    "inductor_decomposition_table",
    "keep_in_forward",
    "lookup_backend",
    "min_cut_partition",
    "module_stack",
    "op_name",
    "op_schema",
    "opinfo_database",
    "opinfo_tolerance_decorators",
    "pin_output_strides",
    "probe",
    "probe_all",
    "profile_all_threads_config",
    "profiler_enabled",
    "record_function_enter",
    "record_function_exit",
    "remove_from_dynamo_cache",
    "require",
    "set_grad_enabled",
    "stack_trace",
    "stream_annotations",
    "support_problem",
    "tag_original_aten",
    "torch_release",
    "collective_op",
    "annotate",
    "set_annotations",
    "tree_flatten",
    "tree_unflatten",
    "flop_formula",
]

# The torch releases airstream supports; pyproject.toml's dependency says the same (checked by
# tests/test_torch_internals.py). TESTED_TORCH: the versions CI runs the test suite on.
SUPPORTED_TORCH = ">=2.13,<2.16"
TESTED_TORCH = ("2.13.0", "2.15.0")
_FLOOR, _CEILING = (2, 13), (2, 16)

GROUPS: Mapping[str, str] = {
    "import": "importing airstream",
    "core": "every torch.compile with airstream",
    "max-autotune": 'mode="max-autotune" (Inductor-compiled segments)',
    "profiler": "airstream.profile() and torch.profiler ranges",
    "explain": "airstream.explain and `airstream explain`",
    "auto-streams": 'passes.auto_streams(cost_model="flops") (its flop estimates)',
    "collectives": "torch.distributed functional collectives in compiled graphs",
    "selftest": "`airstream selftest opinfo`",
    "testing": "airstream's own test suite",
    # reporting only: a missing one warns once and the report says "unknown"; nothing fails
    "diagnostics": "reports (cache hits, the graph-break warning, `airstream doctor`)",
}

# Private attributes of torch objects read here (the boundary test forbids them elsewhere).
PRIVATE_ATTRIBUTES = frozenset(
    {
        "_schema",
        "_opname",
        "_overloadname",
        "_is_profiler_enabled",
        "_record_function_enter_new",
        "_record_function_exit",
        "_RecordFunction",
        "_set_grad_enabled",
        "_c10d_functional",
    }
)

# Node-meta keys torch writes or reads, and the string values airstream exchanges through them
# (the boundary test forbids these literals elsewhere). ``val`` is FX's own and documented.
TORCH_META_KEYS = frozenset(
    {
        "nn_module_stack",
        "fwd_nn_module_stack",
        "stack_trace",
        "custom",
        "partitioner_tag",
        "must_be_in_forward",
        "original_aten",
        "original_output_strides",
        "user_visible_output_idxs",
        "fxgraph_cache_hit",
    }
)

# torch.distributed functional collectives (``torch.distributed._functional_collectives``)
COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d_functional"})
_COLLECTIVE_OPS = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "wait_tensor",
)


def torch_release(version: str | None = None) -> tuple[int, int, int]:
    """``(major, minor, patch)`` of a torch version string (default: the installed torch)."""
    text = torch.__version__ if version is None else version
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if match is None:
        raise ValueError(f"not a torch version: {text!r}")
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def support_problem(version: str | None = None) -> str | None:
    """Why this torch version is outside the supported range, or None when it is inside."""
    release = torch_release(version)[:2]
    if _FLOOR <= release < _CEILING:
        return None
    shown = torch.__version__ if version is None else version
    return (
        f"airstream supports torch {SUPPORTED_TORCH} (tested: {', '.join(TESTED_TORCH)}); this is "
        f"torch {shown}"
    )


if (_outside := support_problem()) is not None:
    warnings.warn(
        f"{_outside}, which airstream has not been tested with. Each private torch API it uses is "
        "checked when first needed; `airstream doctor` checks them all now.",
        stacklevel=2,
    )


def _missing_package(exc: BaseException) -> str | None:
    """The Python package whose absence made a probe fail (not torch itself), if that was it."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        if top not in ("torch", "functorch"):
            return top
    return None


def _advice(group: str) -> str:
    """What to do about a missing private torch API."""
    if support_problem() is None:
        return (
            f"torch {torch.__version__} is in the supported range ({SUPPORTED_TORCH}), so this "
            "is a bug in airstream (or a modified torch build): please report it"
            + (" with `airstream doctor`'s output." if group != "import" else ".")
        )
    return (
        f"airstream supports torch {SUPPORTED_TORCH} (tested: {', '.join(TESTED_TORCH)}): "
        f"pip install 'torch{SUPPORTED_TORCH}'."
        + (" `airstream doctor` lists everything this torch lacks." if group != "import" else "")
    )


def _unsupported(feature: Feature, reason: str, package: str | None = None) -> TorchSupportError:
    if package is not None:
        return TorchSupportError(
            f"airstream needs {feature.api} for {feature.purpose}; importing it failed because "
            f"the Python package {package!r} is not installed ({reason}). Install it with pip "
            f"install {package} (airstream's own dependencies: pip install -e '.[test]' in its "
            "checkout).",
            feature=feature.name,
        )
    return TorchSupportError(
        f"airstream needs {feature.api} for {feature.purpose}, and torch {torch.__version__} "
        f"does not provide it: {reason}. {_advice(feature.group)}",
        feature=feature.name,
    )


@dataclass(frozen=True)
class Feature:
    """One private torch API: ``name`` (short id), ``api`` (the exact private names), ``group``
    (a key of GROUPS), ``purpose`` (what airstream uses it for) and ``probe`` (returns the object
    airstream uses; raises when it is missing or changed)."""

    name: str
    api: str
    group: str
    purpose: str
    probe: Callable[[], Any]


@dataclass(frozen=True)
class ProbeResult:
    """A probe's outcome: ``problem`` is None when the feature is present; ``package`` names a
    missing Python package (not torch) when that is why it failed."""

    feature: Feature
    problem: str | None
    package: str | None = None


FEATURES: dict[str, Feature] = {}
_resolved: dict[str, Any] = {}
_resolve_lock = threading.Lock()


def _feature(name: str, api: str, group: str, purpose: str) -> Callable[[Callable[[], Any]], Any]:
    if group not in GROUPS:
        raise ValueError(f"unknown feature group {group!r}")

    def register(probe: Callable[[], Any]) -> Callable[[], Any]:
        FEATURES[name] = Feature(name, api, group, purpose, probe)
        return probe

    return register


def _get(name: str) -> Any:
    """The object feature ``name`` provides; TorchSupportError if its probe fails."""
    try:
        return _resolved[name]
    except KeyError:
        pass
    feature = FEATURES[name]
    try:
        value = feature.probe()
    except Exception as exc:
        raise _unsupported(feature, f"{type(exc).__name__}: {exc}", _missing_package(exc)) from exc
    with _resolve_lock:
        _resolved[name] = value
    return value


def probe(name: str) -> ProbeResult:
    """Run feature ``name``'s probe (uncached); report instead of raising."""
    feature = FEATURES[name]
    try:
        feature.probe()
    except Exception as exc:
        return ProbeResult(feature, f"{type(exc).__name__}: {exc}", _missing_package(exc))
    return ProbeResult(feature, None)


def probe_all() -> list[ProbeResult]:
    """Every feature's probe, in registration order."""
    # importing torch.utils.cpp_extension on a CUDA build without a GPU logs a warning about
    # CUDA_HOME that has nothing to do with the probes
    quiet = logging.getLogger("torch.utils.cpp_extension")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return [probe(name) for name in FEATURES]
    finally:
        quiet.setLevel(level)


_required: set[str] = set()


def require(group: str) -> None:
    """Check every feature of ``group`` once per process; one TorchSupportError lists all that
    are missing. Called where that group's functionality starts (the first compile, ...)."""
    if group in _required:
        return
    results = [probe(f.name) for f in FEATURES.values() if f.group == group]
    failures = [r for r in results if r.problem is not None]
    if failures:
        if len(failures) == 1:
            only = failures[0]
            raise _unsupported(only.feature, str(only.problem), only.package)
        lines = "\n".join(f"  - {r.feature.api}: {r.problem}" for r in failures)
        packages = sorted({r.package for r in failures if r.package})
        hint = f"Install the missing packages: pip install {' '.join(packages)}. " * bool(packages)
        raise TorchSupportError(
            f"airstream needs private torch APIs for {GROUPS[group]} that torch "
            f"{torch.__version__} does not provide:\n{lines}\n{hint}{_advice(group)}",
            feature=", ".join(r.feature.name for r in failures),
        )
    _required.add(group)


def _attr(path: str) -> Any:
    """``module.sub:attr.attr`` -> the object (ImportError/AttributeError when it moved)."""
    module_name, _, attrs = path.partition(":")
    value: Any = importlib.import_module(module_name)
    for part in attrs.split(".") if attrs else ():
        value = getattr(value, part)
    return value


def _module_reads(module: str, *literals: str) -> None:
    """Check that ``module``'s source still mentions each quoted literal (a meta key it reads).
    A torch installed without its Python sources cannot be checked this way and passes."""
    loaded = importlib.import_module(module)
    try:
        source = inspect.getsource(loaded)
    except (OSError, TypeError):
        return
    for literal in literals:
        if f'"{literal}"' not in source and f"'{literal}'" not in source:
            raise LookupError(f"{module} no longer mentions {literal!r}")


def _takes(fn: Callable[..., Any], *names: str) -> None:
    """Check that ``fn`` accepts each keyword in ``names`` (directly or via a TypedDict)."""
    params = inspect.signature(fn).parameters
    accepted = set(params)
    for param in params.values():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            hints = getattr(fn, "__annotations__", {}).get(param.name)
            accepted |= _typed_dict_keys(fn, hints)
    missing = [n for n in names if n not in accepted]
    if missing:
        raise TypeError(f"{fn.__qualname__}() takes no keyword argument(s) {missing}")


def _typed_dict_keys(fn: Callable[..., Any], hint: Any) -> set[str]:
    """Keys of the TypedDict in a ``**kwargs: Unpack[TD]`` annotation (a string or an object)."""
    text = hint if isinstance(hint, str) else repr(hint)
    match = re.search(r"Unpack\[([\w.]+)\]", text)
    if match is None:
        return set()
    typed = fn.__globals__.get(match.group(1).rsplit(".", 1)[-1])
    return set(getattr(typed, "__annotations__", {}))


# --- bound at import: names airstream uses everywhere, or on a hot path ----------------------


def _bind(name: str) -> Any:
    """Resolve a feature while airstream is imported (a TorchSupportError fails the import)."""
    return _get(name)


_warned: set[str] = set()


def _optional(name: str) -> Any | None:
    """A diagnostics feature: its object, or None after one warning naming what is missing."""
    try:
        return _get(name)
    except TorchSupportError as exc:
        with _resolve_lock:
            first = name not in _warned
            _warned.add(name)
        if first:
            warnings.warn(f"{exc} Until then it reports 'unknown'.", stacklevel=3)
        return None


@_feature(
    "op_overload",
    "torch._ops.OpOverload, OpOverloadPacket, OperatorBase and OpOverload._schema, ._opname, "
    "._overloadname",
    "import",
    "recognising aten ops and reading their schemas (mutation, aliasing, names)",
)
def _probe_op_overload() -> tuple[type, type, type]:
    ops = importlib.import_module("torch._ops")
    op = torch.ops.aten.add_.Tensor
    if not isinstance(op, ops.OpOverload):
        raise TypeError("torch.ops.aten.add_.Tensor is not a torch._ops.OpOverload")
    if not op._schema.is_mutable or op._opname != "add_" or op._overloadname != "Tensor":
        raise AttributeError("OpOverload._schema/._opname/._overloadname changed meaning")
    return ops.OpOverload, ops.OpOverloadPacket, ops.OperatorBase


@_feature(
    "fake_tensor",
    "torch._subclasses.fake_tensor.FakeTensor, FakeTensorMode and torch._guards.detect_fake_mode",
    "import",
    "the example inputs passes receive and the metadata airstream fills in",
)
def _probe_fake_tensor() -> tuple[type, type, Callable[..., Any]]:
    fake = importlib.import_module("torch._subclasses.fake_tensor")
    detect = _attr("torch._guards:detect_fake_mode")
    with fake.FakeTensorMode() as mode:
        value = torch.empty(2)
    if not isinstance(value, fake.FakeTensor) or detect([value]) is not mode:
        raise TypeError("detect_fake_mode does not find a FakeTensor's mode")
    return fake.FakeTensor, fake.FakeTensorMode, detect


@_feature(
    "grad_mode",
    "torch._C._set_grad_enabled",
    "import",
    "following the caller's grad mode on stream worker threads (once per call)",
)
def _probe_grad_mode() -> Callable[[bool], None]:
    fn = _attr("torch._C:_set_grad_enabled")
    before = torch.is_grad_enabled()
    fn(not before)
    flipped = torch.is_grad_enabled()
    fn(before)
    if flipped == before:
        raise RuntimeError("torch._C._set_grad_enabled does not change torch.is_grad_enabled()")
    return fn


@_feature(
    "profiler_flag",
    "torch.autograd.profiler._is_profiler_enabled",
    "import",
    "checking once per compiled call whether torch.profiler records (traced code or plain)",
)
def _probe_profiler_flag() -> Any:
    module = torch.autograd.profiler
    if not isinstance(module._is_profiler_enabled, bool):
        raise TypeError("torch.autograd.profiler._is_profiler_enabled is not a bool")
    return module


@_feature(
    "dynamo_skip",
    "torch._dynamo.decorators.skip",
    "import",
    "keeping airstream.stream's eager-mode check out of Dynamo's tracing",
)
def _probe_dynamo_skip() -> Callable[..., Any]:
    return _attr("torch._dynamo.decorators:skip")


OpOverload, OpOverloadPacket, OperatorBase = _bind("op_overload")
FakeTensor, FakeTensorMode, detect_fake_mode = _bind("fake_tensor")
set_grad_enabled: Callable[[bool], None] = _bind("grad_mode")
dynamo_skip: Callable[..., Any] = _bind("dynamo_skip")
_profiler_module = _bind("profiler_flag")


def profiler_enabled() -> bool:
    """torch.profiler (or torch.autograd.profiler) is recording. One attribute read; unlike the
    thread-local C++ check it is also set with ``profile_all_threads=True``."""
    return _profiler_module._is_profiler_enabled


def op_schema(target: Any) -> torch.FunctionSchema | None:
    """The schema of an aten (or any registered) op overload; None for anything else."""
    return target._schema if isinstance(target, OpOverload) else None


def op_name(target: OpOverload) -> tuple[str, str, str]:
    """``(namespace, name, overload)`` of an op overload: ``("aten", "mm", "default")``."""
    return target.namespace, target._opname, target._overloadname


def collective_op_name(target: Any) -> str | None:
    """``all_reduce``, ``wait_tensor``, ... for a functional-collective op, else None."""
    if isinstance(target, OpOverload) and target.namespace in COLLECTIVE_NAMESPACES:
        return target._opname
    return None


# --- node metadata torch's tracers write ------------------------------------------------------


@_feature(
    "trace_meta",
    "node.meta keys 'nn_module_stack' (Dynamo), 'fwd_nn_module_stack' (AOTAutograd, backward "
    "nodes) and 'stack_trace'",
    "core",
    "module-path selection in passes (backward graphs included) and source lines in errors",
)
def _probe_trace_meta() -> None:
    _module_reads("torch._functorch._aot_autograd.utils", "fwd_nn_module_stack", "nn_module_stack")
    _module_reads("torch.fx.proxy", "nn_module_stack", "stack_trace")


@_feature(
    "annotate",
    "torch.fx.traceback.annotate and the node.meta['custom'] key it writes",
    "import",
    "airstream.stream's annotation, which carries a stream into backward graphs",
)
def _probe_annotate() -> Callable[..., Any]:
    annotate = _attr("torch.fx.traceback:annotate")
    _takes(annotate, "annotation_dict")
    _module_reads("torch.fx.traceback", "custom")
    _module_reads("torch.fx.proxy", "custom")
    return annotate


annotate: Callable[..., Any] = _bind("annotate")  # airstream.stream is traced by Dynamo: bound now


def module_stack(node: torch.fx.Node) -> Mapping[str, Any]:
    """The node's ``nn_module_stack`` (forward and inference graphs) or, in a backward graph, the
    stack of the forward node it came from (``fwd_nn_module_stack``); ``{}`` when unknown."""
    return node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack") or {}


def stack_trace(node: torch.fx.Node) -> str | None:
    """The Python stack the node was traced from, if recorded."""
    return node.meta.get("stack_trace")


def stream_annotations(node: torch.fx.Node) -> Mapping[str, Any]:
    """The node's ``torch.fx.traceback.annotate`` annotations (``{}`` when none)."""
    return node.meta.get("custom") or {}


def set_annotations(node: torch.fx.Node, annotations: Mapping[str, Any]) -> None:
    """Set the node's annotations, as ``torch.fx.traceback.annotate`` does while tracing."""
    node.meta["custom"] = dict(annotations)


# --- core: AOTAutograd and the partitioner ----------------------------------------------------


@_feature(
    "aot_autograd",
    "torch._dynamo.backends.common.aot_autograd and torch._functorch.aot_autograd."
    "aot_module_simplified(fw_compiler, bw_compiler, inference_compiler, decompositions, "
    "partition_fn, keep_inference_input_mutations)",
    "core",
    "tracing Dynamo's graph into forward, backward and inference aten graphs",
)
def _probe_aot_autograd() -> tuple[Callable[..., Any], Callable[..., Any]]:
    aot = _attr("torch._dynamo.backends.common:aot_autograd")
    simplified = _attr("torch._functorch.aot_autograd:aot_module_simplified")
    _takes(
        simplified,
        "fw_compiler",
        "bw_compiler",
        "inference_compiler",
        "decompositions",
        "partition_fn",
        "keep_inference_input_mutations",
    )
    return aot, simplified


@_feature(
    "partitioner",
    "functorch.compile.min_cut_rematerialization_partition, torch._functorch.config.cse and "
    "node.meta['partitioner_tag'] = 'must_be_in_forward'",
    "core",
    "splitting training graphs with every air op kept in the forward graph",
)
def _probe_partitioner() -> tuple[Callable[..., Any], Any]:
    partition = _attr("functorch.compile:min_cut_rematerialization_partition")
    _takes(partition, "joint_module", "num_fwd_outputs")
    config = _attr("torch._functorch:config")
    if not isinstance(config.cse, bool):
        raise AttributeError("torch._functorch.config.cse is not a bool option")
    _module_reads("torch._functorch.partitioners", "partitioner_tag", "must_be_in_forward")
    return partition, config


def aot_autograd(**kwargs: Any) -> Any:
    """torch's ``aot_autograd`` backend factory (Dynamo graph -> AOTAutograd -> compilers)."""
    return _get("aot_autograd")[0](**kwargs)


def aot_module_simplified(*args: Any, **kwargs: Any) -> Any:
    """AOTAutograd on a Dynamo graph, for code that wires the compilers itself."""
    return _get("aot_autograd")[1](*args, **kwargs)


def keep_in_forward(node: torch.fx.Node) -> None:
    """Tell the partitioner that ``node`` must stay in the forward graph."""
    node.meta["partitioner_tag"] = "must_be_in_forward"


def min_cut_partition(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
    """Inductor's min-cut partitioner with its own CSE off (it would merge identical air ops,
    e.g. two scopes with the same label, and so move nodes off their stream)."""
    partition, config = _get("partitioner")
    with config.patch(cse=False):
        return partition(joint, joint_inputs, **kwargs)


# --- airstream.stream's eager check -----------------------------------------------------------


@_feature(
    "eval_frame_callback",
    "torch._C._dynamo.eval_frame.get_eval_frame_callback",
    "diagnostics",
    "warning when airstream.stream runs eagerly inside a torch.compile'd call (a graph break)",
)
def _probe_eval_frame_callback() -> Callable[[], Any]:
    get = _attr("torch._C._dynamo.eval_frame:get_eval_frame_callback")
    get()
    return get


def eval_frame_callback_getter() -> Callable[[], Any] | None:
    """Dynamo's C function returning its frame hook (set while eager code runs inside a compiled
    call), to be called from a ``dynamo_skip`` frame: being C, it opens no frame Dynamo would
    try to trace. None (after one warning) on a torch without it."""
    return _optional("eval_frame_callback")


# --- max-autotune: Inductor -------------------------------------------------------------------


@_feature(
    "inductor_compile",
    "torch._inductor.compile_fx.compile_fx_inner(is_inference, is_backward), "
    "torch._inductor.config.cpp.threads, torch._guards.TracingContext/tracing and the compiled "
    "graph's source_code",
    "max-autotune",
    'compiling each segment with Inductor in mode="max-autotune"',
)
def _probe_inductor_compile() -> tuple[Callable[..., Any], Any, Any, Any]:
    compile_inner = _attr("torch._inductor.compile_fx:compile_fx_inner")
    _takes(compile_inner, "is_inference", "is_backward")
    config = _attr("torch._inductor:config")
    if not isinstance(config.cpp.threads, int):
        raise AttributeError("torch._inductor.config.cpp.threads is not an int option")
    context, tracing = _attr("torch._guards:TracingContext"), _attr("torch._guards:tracing")
    output_code = _attr("torch._inductor.output_code:CompiledFxGraph")
    if "source_code" not in getattr(output_code, "__dataclass_fields__", {}):
        raise AttributeError("CompiledFxGraph has no source_code field")
    return compile_inner, config, context, tracing


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


@contextlib.contextmanager
def _inductor_context(fake_mode: Any, threads: int) -> Iterator[None]:
    _, config, context, tracing = _get("inductor_compile")
    patches = {"cpp.threads": threads} if threads > 0 else {}
    with tracing(context(fake_mode)), config.patch(patches):
        yield


def inductor_compile(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    fake_mode: Any,
    graph_kind: str,
    threads: int = 0,
) -> tuple[Callable[[list[Any]], Any], str]:
    """Compile a decomposed aten graph with Inductor, in a tracing context of ``fake_mode``;
    ``threads`` > 0 fixes generated CPU kernels' intra-op threads. Returns the boxed callable
    (takes a list of inputs) and Inductor's generated source (``""`` if it has none)."""
    compile_inner = _get("inductor_compile")[0]
    with _inductor_context(fake_mode, threads):
        compiled = compile_inner(
            gm,
            list(example_inputs),
            is_inference=graph_kind == "inference",
            is_backward=graph_kind == "backward",
        )
    return compiled, getattr(compiled, "source_code", "") or ""


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


# --- auto_streams: the flop counter's formulas ----------------------------------------------


@_feature(
    "flop_formulas",
    "torch.utils.flop_counter.flop_registry (op packet -> formula(*args, out_val=...))",
    "auto-streams",
    "estimating each node's flops in auto_streams' flops cost model",
)
def _probe_flop_formulas() -> Mapping[Any, Callable[..., Any]]:
    registry = _attr("torch.utils.flop_counter:flop_registry")
    a, b = torch.empty(4, 8, device="meta"), torch.empty(8, 16, device="meta")
    flops = registry[torch.ops.aten.mm](a, b, out_val=torch.empty(4, 16, device="meta"))
    if flops != 2 * 4 * 8 * 16:
        raise ValueError(f"the mm formula counts {flops} flops for 4x8 @ 8x16, not 1024")
    return registry


def flop_formula(target: Any) -> Callable[..., Any] | None:
    """torch's flop formula for an op overload (called as ``formula(*args, out_val=out)`` on
    tensors or their metadata), or None for an op it has none for."""
    packet = getattr(target, "overloadpacket", None)
    return None if packet is None else _get("flop_formulas").get(packet)


# --- profiler ---------------------------------------------------------------------------------


@_feature(
    "record_function",
    "torch.ops.profiler._record_function_enter_new and "
    "torch.ops.profiler._record_function_exit._RecordFunction",
    "profiler",
    "naming each op `stream:node` in torch.profiler traces",
)
def _probe_record_function() -> tuple[Any, Any]:
    return (
        torch.ops.profiler._record_function_enter_new,
        torch.ops.profiler._record_function_exit._RecordFunction,
    )


def record_function_enter(name: str) -> Any:
    """Open a torch.profiler range on this thread; returns the handle to close it with."""
    return _get("record_function")[0](name, None)


def record_function_exit(handle: Any) -> None:
    """Close a range opened by :func:`record_function_enter`."""
    _get("record_function")[1](handle)


@_feature(
    "profiler_all_threads",
    "torch._C._profiler._ExperimentalConfig(profile_all_threads=True)",
    "testing",
    "tests that profile the stream worker threads with torch.profiler",
)
def _probe_profiler_all_threads() -> Callable[..., Any]:
    cls = _attr("torch._C._profiler:_ExperimentalConfig")
    cls(profile_all_threads=True)
    return cls


def profile_all_threads_config() -> Any:
    """A torch.profiler experimental config that records every thread, not just the caller."""
    return _get("profiler_all_threads")(profile_all_threads=True)


# --- explain ----------------------------------------------------------------------------------


@_feature(
    "dynamo_explain",
    "torch._dynamo.exc.Unsupported and torch._dynamo.eval_frame.remove_from_cache",
    "explain",
    "finding graph breaks and compiling a model without keeping its compiled code",
)
def _probe_dynamo_explain() -> tuple[type, Callable[[Any], None]]:
    unsupported = _attr("torch._dynamo.exc:Unsupported")
    if not issubclass(unsupported, Exception):
        raise TypeError("torch._dynamo.exc.Unsupported is not an exception")
    return unsupported, _attr("torch._dynamo.eval_frame:remove_from_cache")


def dynamo_unsupported() -> type[Exception]:
    """The exception Dynamo raises for a graph break under ``fullgraph=True``."""
    return _get("dynamo_explain")[0]


def remove_from_dynamo_cache(fn: Any) -> None:
    """Drop Dynamo's compiled code for ``fn`` (the next compile starts afresh)."""
    _get("dynamo_explain")[1](fn)


@_feature("graph_break", "torch._dynamo.graph_break", "testing", "tests that force graph breaks")
def _probe_graph_break() -> Callable[[], None]:
    return _attr("torch._dynamo:graph_break")


def dynamo_graph_break() -> Callable[[], None]:
    """The function that forces a Dynamo graph break where it is called (tests; resolve it
    outside compiled code)."""
    return _get("graph_break")


@_feature(
    "backend_registry",
    "torch._dynamo.backends.registry.lookup_backend",
    "testing",
    "checking that torch.compile(backend='airstream') resolves to airstream's entry point",
)
def _probe_backend_registry() -> Callable[[str], Any]:
    return _attr("torch._dynamo.backends.registry:lookup_backend")


def lookup_backend(name: str) -> Any:
    """The callable torch.compile uses for ``backend=name``."""
    return _get("backend_registry")(name)


# --- collectives ------------------------------------------------------------------------------


@_feature(
    "functional_collectives",
    "torch.distributed._functional_collectives and the torch.ops._c10d_functional ops "
    + ", ".join(_COLLECTIVE_OPS),
    "collectives",
    "compiling torch.distributed collectives and the tensor-parallel benchmark",
)
def _probe_functional_collectives() -> Any:
    if not torch.distributed.is_available():
        raise RuntimeError("torch.distributed is not available in this torch build")
    namespace = torch.ops._c10d_functional
    for name in _COLLECTIVE_OPS:
        getattr(namespace, name).default  # noqa: B018 (resolving the op is the probe)
    module = importlib.import_module("torch.distributed._functional_collectives")
    for name in ("all_reduce", "all_gather_tensor", "reduce_scatter_tensor", "wait_tensor"):
        getattr(module, name)
    return module


def functional_collectives() -> Any:
    """``torch.distributed._functional_collectives`` (traceable collectives)."""
    return _get("functional_collectives")


def collective_op(name: str) -> OpOverload:
    """The aten-level op of a functional collective: ``collective_op("all_reduce")``."""
    _get("functional_collectives")
    return getattr(torch.ops._c10d_functional, name).default


@_feature(
    "fake_process_group",
    "torch.testing._internal.distributed.fake_pg.FakeStore",
    "testing",
    "tests of collectives on torch's in-process fake process group",
)
def _probe_fake_process_group() -> type:
    return _attr("torch.testing._internal.distributed.fake_pg:FakeStore")


def fake_store() -> Any:
    """A store for ``dist.init_process_group("fake", ...)``."""
    return _get("fake_process_group")()


# --- selftest: the OpInfo sweep ---------------------------------------------------------------


@_feature(
    "opinfo",
    "torch.testing._internal.common_methods_invocations.op_db, common_device_type."
    "toleranceOverride and opinfo.core.DecorateInfo (needs numpy and expecttest)",
    "selftest",
    "sweeping PyTorch's OpInfo database through airstream",
)
def _probe_opinfo() -> tuple[Any, type, type]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op_db = _attr("torch.testing._internal.common_methods_invocations:op_db")
    if not op_db:
        raise LookupError("op_db is empty")
    return (
        op_db,
        _attr("torch.testing._internal.common_device_type:toleranceOverride"),
        _attr("torch.testing._internal.opinfo.core:DecorateInfo"),
    )


def opinfo_database() -> Sequence[Any]:
    """PyTorch's OpInfo database (``op_db``)."""
    return _get("opinfo")[0]


def opinfo_tolerance_decorators() -> tuple[type, type]:
    """``(toleranceOverride, DecorateInfo)``: the classes an OpInfo's tolerances are read from."""
    return _get("opinfo")[1], _get("opinfo")[2]


@_feature(
    "reference_backends",
    "torch._dynamo.backends.debugging.aot_eager and torch._inductor.compile_fx.compile_fx",
    "selftest",
    "the aot_eager and Inductor columns the OpInfo sweep compares airstream with",
)
def _probe_reference_backends() -> tuple[Callable[..., Any], Callable[..., Any]]:
    return (
        _attr("torch._dynamo.backends.debugging:aot_eager"),
        _attr("torch._inductor.compile_fx:compile_fx"),
    )


@_feature(
    "pytree",
    "torch.utils._pytree.tree_flatten and tree_unflatten",
    "selftest",
    "rebuilding an OpInfo sample's arguments around new tensors",
)
def _probe_pytree() -> tuple[Callable[..., Any], Callable[..., Any]]:
    flatten = _attr("torch.utils._pytree:tree_flatten")
    unflatten = _attr("torch.utils._pytree:tree_unflatten")
    leaves, spec = flatten(((1, 2), {"a": 3}))
    if leaves != [1, 2, 3] or unflatten(leaves, spec) != ((1, 2), {"a": 3}):
        raise ValueError("tree_flatten/tree_unflatten do not round-trip")
    return flatten, unflatten


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """torch's pytree flattening: ``(leaves, spec)``."""
    return _get("pytree")[0](tree)


def tree_unflatten(leaves: Sequence[Any], spec: Any) -> Any:
    """The inverse of :func:`tree_flatten`."""
    return _get("pytree")[1](list(leaves), spec)


def aot_eager(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """torch's ``aot_eager`` backend (AOTAutograd, no compiler): the reference column."""
    return _get("reference_backends")[0](gm, example_inputs)


def compile_fx(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """Inductor as a Dynamo backend."""
    return _get("reference_backends")[1](gm, list(example_inputs))
