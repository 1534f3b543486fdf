"""Which TorchAir options act here, and the airstream option each one sets: the one table.

:data:`_AIRSTREAM` maps a TorchAir option path to airstream's option path (and how its value
converts); :data:`MODES` is how TorchAir's ``config.mode`` maps to airstream's ``mode``. The
TorchAir :class:`~airstream.compat.torchair.config.CompilerConfig` builds airstream's config
from these each time a graph compiles (data flows one way: TorchAir's config is a view onto
airstream's options); a TorchAir option in neither table nor :data:`_READ_HERE` is NPU-only,
stored and warned about once. Custom passes are wrapped (:class:`_TorchairPass`) so they receive
the TorchAir config, as under TorchAir.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from airstream.compat.torchair.logger import logger
from airstream.compat.torchair.values import Value

__all__ = ["MODES", "capture_mode"]

MODES: dict[str, str] = {
    "max-autotune": "max-autotune",
    "reduce-overhead": "reduce-overhead",
    "npugraph_ex": "reduce-overhead",
}
"""TorchAir's ``config.mode`` -> airstream's ``mode``, by what each mode does to a graph.

- ``max-autotune`` (TorchAir's default) is GE graph mode: the whole FX graph becomes one Ascend
  graph-engine graph, compiled and fused as a whole. airstream's ``max-autotune`` is the nearest
  off the NPU: Inductor compiles the fusible segments on each stream (streams stay airstream's).
  So TorchAir's default config compiles as airstream's max-autotune on every device, where
  airstream's own default (:class:`airstream.CompilerConfig`, ``"default"``) is chosen per
  device (max-autotune on CPU, reduce-overhead on CUDA): a TorchAir script asked for a
  compiled graph.
- ``reduce-overhead`` is aclgraph: the graph is captured once and replayed (the NPU's CUDA
  graphs); ``npugraph_ex`` is the same capture-and-replay through torch_npu's package. Both are
  airstream's ``reduce-overhead``: generated aten code, captured as CUDA graphs on CUDA.
"""


class _Config(Protocol):
    """The TorchAir config as this module reads it (its class, in config.py, imports this one)."""

    @property
    def mode(self) -> Value: ...


def capture_mode(config: _Config) -> bool:
    """TorchAir's graph-capture modes (aclgraph, npugraph_ex: those :data:`MODES` maps to
    reduce-overhead), where its reinplace passes run."""
    return MODES.get(config.mode.value) == "reduce-overhead"


def _graph_name(gm: Any) -> str:
    """TorchAir's name for the graph in its logs: ``backward`` or ``forward`` (inference too)."""
    nodes = getattr(getattr(gm, "graph", None), "nodes", ())
    backward = any(n.op == "placeholder" and n.name.startswith("tangents") for n in nodes)
    return "backward" if backward else "forward"


class _TorchairPass:
    """A custom pass set on the TorchAir config: called as ``fn(gm, example_inputs, config)``
    with that TorchAir config, as TorchAir calls it (airstream's own config is not passed), and
    logged before and after on the ``torchair`` logger in TorchAir's words."""

    def __init__(self, fn: Callable[..., Any], config: _Config, slot: str) -> None:
        self.fn, self.config, self.slot = fn, config, slot
        functools.update_wrapper(self, fn)  # the pass's name in errors

    def __call__(self, gm: Any, example_inputs: Any, _config: Any = None) -> Any:
        name = _graph_name(gm)
        logger.debug("[%s] before [%s] execution, graph is: %s", name, self.slot, gm.graph)
        result = self.fn(gm, example_inputs, self.config)
        logger.debug("[%s] after [%s] execution, graph is: %s", name, self.slot, gm.graph)
        return result

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _TorchairPass):
            return NotImplemented
        return (self.fn, self.slot) == (other.fn, other.slot) and self.config is other.config

    def __hash__(self) -> int:
        return hash((id(self.fn), id(self.config), self.slot))

    def __repr__(self) -> str:
        return f"{self.fn!r} (called with the TorchAir CompilerConfig)"


@dataclass(frozen=True)
class _Sets:
    """A TorchAir option that works here: it sets airstream's ``target`` option to
    ``convert(value, torchair_config)``."""

    target: str
    convert: Callable[[Any, _Config], Any] = lambda value, config: value


def _wrap_pass(slot: str) -> Callable[[Any, _Config], Any]:
    def wrap(value: Any, config: _Config) -> Any:
        return None if value is None else _TorchairPass(value, config, slot)

    return wrap


_AIRSTREAM: dict[str, _Sets] = {
    "mode": _Sets("mode", lambda v, c: MODES[v]),
    "post_grad_custom_pre_pass": _Sets(
        "post_grad_custom_pre_pass", _wrap_pass("post_grad_custom_pre_pass")
    ),
    "post_grad_custom_post_pass": _Sets(
        "post_grad_custom_post_pass", _wrap_pass("post_grad_custom_post_pass")
    ),
    "debug.run_eagerly": _Sets("debug.run_eagerly"),
    "debug.graph_dump.type": _Sets(
        "debug.graph_dump.type",
        lambda v, c: "txt" if v == "pbtxt" else v,  # pbtxt: GE's format
    ),
    "debug.graph_dump._dir": _Sets("debug.graph_dump.path", lambda v, c: v or "."),
    "debug.data_dump.type": _Sets("debug.data_dump.type"),
    "debug.data_dump._dir": _Sets("debug.data_dump.path", lambda v, c: v or "."),
    "debug.data_dump.filter": _Sets("debug.data_dump.filter"),
    "experimental_config.keep_inference_input_mutations": _Sets(
        "experimental_config.keep_inference_input_mutations"
    ),
    "experimental_config.remove_noop_ops": _Sets("experimental_config.remove_noop_ops"),
    "experimental_config.enable_view_optimize": _Sets("experimental_config.enable_view_optimize"),
    "ge_config.enable_single_stream": _Sets("ge_config.enable_single_stream"),
    # TorchAir rewrites ops in place in its graph-capture modes only
    "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": _Sets(
        "experimental_config.reinplace_inplaceable_ops", lambda v, c: capture_mode(c) and not v
    ),
    "debug.aclgraph.disable_reinplace_input_mutated_ops_pass": _Sets(
        "experimental_config.reinplace_input_mutations", lambda v, c: capture_mode(c) and not v
    ),
}
"""TorchAir option path -> what it sets in airstream's config (the options that act here)."""

# TorchAir options that act here without an airstream option of their own (read in .airstream)
_READ_HERE = frozenset({"experimental_config.pattern_fusion_pass"})
# The paths users set (properties) for the leaves the table names
_SETTABLE_ALIASES = {
    "debug.graph_dump.path": "debug.graph_dump._dir",
    "debug.data_dump.path": "debug.data_dump._dir",
}
