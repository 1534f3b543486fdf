"""The registry of private torch APIs: the supported range, features and their probes, the
checks (``require``) and the errors. The features themselves live in the sibling modules."""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.autograd.profiler
import torch.fx

from airstream.errors import TorchSupportError

# The torch releases airstream supports; pyproject.toml's dependency says the same (checked by
# tests/test_torch_internals.py). TESTED_TORCH: the versions CI installs, a release of each minor
# in the range (.ci/run says which tests run on which).
SUPPORTED_TORCH = ">=2.11,<2.16"
TESTED_TORCH = ("2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
_FLOOR, _CEILING = (2, 11), (2, 16)

GROUPS: Mapping[str, str] = {
    "import": "importing airstream",
    "core": "every torch.compile with airstream",
    "max-autotune": 'mode="max-autotune" (Inductor-compiled segments)',
    "profiler": "airstream.profile() and torch.profiler ranges",
    "explain": "airstream.explain and `airstream explain`",
    "auto-streams": 'passes.auto_streams(cost_model="flops") (its flop estimates)',
    "collectives": "torch.distributed functional collectives in compiled graphs",
    "cuda-graphs": 'mode="reduce-overhead" CUDA graphs (weights captured by address)',
    "selftest": "`airstream selftest opinfo`",
    "testing": "airstream's own test suite",
    "patterns": "registered pattern replacements (airstream.passes.Replacements)",
    "reinplace": "experimental_config.reinplace_input_mutations (custom ops writing inputs)",
    "torchair": "the TorchAir compat layer (`airstream run --torchair`, set_dim_gears)",
    "torch-streams": "torch.Stream, torch.Event and wait_stream in compiled model code",
    "inductor-pass": "airstream's stream passes as Inductor custom passes (airstream.inductor)",
    "compile-cache": "airstream.cache_compile and TorchAir's cache_compile (compiled code on disk)",
    "cpu-streams": "worker-thread side streams on CPU (their matrix multiplies' thread count)",
    # optional: without it a side stream carries the caller's grad and inference mode only
    "thread-state": "side streams under the caller's thread state (torch.profiler, modes, hooks)",
    # optional: without it a segment's CPU kernels hold the GIL (streams' kernels take turns)
    "kernels-without-gil": "Inductor CPU kernels of several streams running at once",
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
        "_artifacts",
        "_lineno_map",
        "_prologue_start",
        "_parameters",
        "_buffers",
        "_modules",
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
        value = _run_probe(feature)
    except Exception as exc:
        raise _unsupported(feature, f"{type(exc).__name__}: {exc}", _missing_package(exc)) from exc
    with _resolve_lock:
        _resolved[name] = value
    return value


def _run_probe(feature: Feature) -> Any:
    """Run a probe with torch's own deprecation warnings silenced: importing a torch module that
    warns must not count as a missing API when the caller turned warnings into errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        return feature.probe()


def probe(name: str) -> ProbeResult:
    """Run feature ``name``'s probe (uncached); report instead of raising."""
    feature = FEATURES[name]
    try:
        _run_probe(feature)
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


def _optional(name: str, until: str = "it reports 'unknown'") -> Any | None:
    """An optional feature: its object, or None after one warning naming what is missing and,
    in ``until``, what airstream does without it."""
    try:
        return _get(name)
    except TorchSupportError as exc:
        with _resolve_lock:
            first = name not in _warned
            _warned.add(name)
        if first:
            warnings.warn(f"{exc} Until then {until}.", stacklevel=3)
        return None
