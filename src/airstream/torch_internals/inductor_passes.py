"""Private torch APIs of Inductor's pass machinery that airstream's passes use: the pattern
matcher (``airstream.passes.Replacements``, TorchAir's ``register_replacement``) and Inductor's
custom post-grad passes (``CustomGraphPass``, ``CustomGraphModulePass``), in both directions."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from airstream.torch_internals.registry import _attr, _feature, _get, _takes

# --- pattern replacements: Inductor's pattern matcher ------------------------------------------


@_feature(
    "pattern_matcher",
    "torch._inductor.pattern_matcher.register_replacement(search_fn, replace_fn, example_inputs, "
    "trace_fn, pass_dicts, extra_check, scalar_workaround, search_fn_pattern, skip_duplicates), "
    "PatternMatcherPass(pass_name).apply(graph) and fwd_only",
    "patterns",
    "replacing registered subgraphs (airstream.passes.Replacements, torchair.register_replacement)",
)
def _probe_pattern_matcher() -> tuple[Callable[..., Any], Any, Callable[..., Any]]:
    register = _attr("torch._inductor.pattern_matcher:register_replacement")
    _takes(
        register,
        "search_fn",
        "replace_fn",
        "example_inputs",
        "trace_fn",
        "pass_dicts",
        "extra_check",
        "scalar_workaround",
        "search_fn_pattern",
        "skip_duplicates",
    )
    matcher_pass = _attr("torch._inductor.pattern_matcher:PatternMatcherPass")
    _takes(matcher_pass, "pass_name")
    return register, matcher_pass, _attr("torch._inductor.pattern_matcher:fwd_only")


def pattern_pass(name: str) -> Any:
    """A new, empty set of pattern replacements (Inductor's ``PatternMatcherPass``)."""
    _, matcher_pass, _ = _get("pattern_matcher")
    return matcher_pass(pass_name=name)


def trace_forward() -> Callable[..., Any]:
    """Inductor's ``fwd_only``: traces a search or replace function into an aten graph."""
    return _get("pattern_matcher")[2]


def register_pattern(patterns: Any, **kwargs: Any) -> bool:
    """Register one replacement in ``patterns`` (``register_replacement``'s keywords)."""
    register = _get("pattern_matcher")[0]
    return bool(register(pass_dicts=patterns, **kwargs))


def apply_patterns(patterns: Any, gm: torch.fx.GraphModule) -> int:
    """Replace every match of ``patterns`` in ``gm``; return how many."""
    return int(patterns.apply(gm.graph))


# --- airstream's passes as Inductor custom passes ----------------------------------------


@_feature(
    "custom_graph_pass",
    "torch._inductor.custom_graph_pass.CustomGraphPass (__call__(graph), uuid()) and "
    "get_hash_for_files",
    "inductor-pass",
    "handing airstream's stream passes to Inductor as post-grad custom passes",
)
def _probe_custom_graph_pass() -> tuple[type, Any]:
    module = importlib.import_module("torch._inductor.custom_graph_pass")
    base = module.CustomGraphPass
    for name in ("__call__", "uuid"):
        if not callable(getattr(base, name, None)):
            raise AttributeError(f"CustomGraphPass has no {name}()")
    return base, module.get_hash_for_files


def custom_graph_pass() -> tuple[type, Any]:
    """torch's ``CustomGraphPass`` base class and its ``get_hash_for_files``."""
    found: tuple[type, Any] = _get("custom_graph_pass")
    return found


@_feature(
    "custom_graph_module_pass",
    "torch._inductor.custom_graph_pass.CustomGraphModulePass (__call__(gm), uuid())",
    "inductor-pass",
    "running Inductor passes written on a GraphModule in airstream's pipeline",
)
def _probe_custom_graph_module_pass() -> type:
    base = importlib.import_module("torch._inductor.custom_graph_pass").CustomGraphModulePass
    if not callable(getattr(base, "uuid", None)):
        raise AttributeError("CustomGraphModulePass has no uuid()")
    return base


def custom_graph_module_pass() -> type:
    """torch's ``CustomGraphModulePass`` base class (a pass called with the GraphModule)."""
    found: type = _get("custom_graph_module_pass")
    return found


def is_inductor_pass(fn: Any) -> bool:
    """Whether ``fn`` is an instance of Inductor's ``CustomGraphPass`` or
    ``CustomGraphModulePass`` (called as Inductor calls them, whatever their signature says);
    False where this torch has neither."""
    if is_graph_module_pass(fn):
        return True
    try:
        base, _ = custom_graph_pass()
    except Exception:
        return False
    return isinstance(fn, base)


def is_graph_module_pass(fn: Any) -> bool:
    """Whether ``fn`` is an Inductor ``CustomGraphModulePass`` (called with the GraphModule, not
    its Graph); False where this torch has none."""
    try:
        base = custom_graph_module_pass()
    except Exception:
        return False
    return isinstance(fn, base)
