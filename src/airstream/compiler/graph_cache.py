"""torch.compile's restart with airstream's backend: each inference graph's compile is kept in
AOTAutograd's own cache (in Inductor's cache directory, ``$TORCHINDUCTOR_CACHE_DIR``), so the
next process that traces the same Dynamo graph loads it instead of running AOTAutograd and the
passes again, as Inductor's own graphs are loaded.

The entry holds the graph as the passes left it (:mod:`airstream.compiler.cached_graph`); a load
finishes it as a compile does (:func:`airstream.compiler.measuring.finish_placed`: the plan,
max-autotune's segments from Inductor's FX graph cache, a measured placement's candidates and
the decisions kept on disk) and reports it to the backend (``backend.graphs``, with
``loaded=True``). AOTAutograd's key (the Dynamo graph, its inputs' metadata, torch's configs and
version) gets airstream's :func:`graph_cache_key` added through the key tag, so only a compile
with the same options, passes, decompositions and airstream is served.

Not kept: training graphs (their backward is compiled later, by another route), a compile with
a debug option that writes at compile time (``debug.graph_dump``, ``debug.data_dump``,
``debug.run_eagerly``) or with observers given to the backend (they would miss the passes'
events), and anything where torch's own switches turn AOTAutograd's cache off
(``TORCHINDUCTOR_AUTOGRAD_CACHE=0``, ``torch.compiler.config.force_disable_caches``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from airstream import torch_internals
from airstream.compiler.cache_key import (
    airstream_version,
    costs_field,
    digest,
    option_identities,
    pass_identity,
    ranks,
)
from airstream.machine import environment
from airstream.options.config import CompilerConfig

__all__ = ["debugging", "graph_cache_key"]


def debugging(config: CompilerConfig) -> str | None:
    """The debug option that writes something at compile time, if one is set (a graph served
    from a cache is not compiled, so it would write nothing)."""
    debug = config.debug
    if debug.graph_dump.type is not None:
        return "debug.graph_dump.type"
    if debug.data_dump.type is not None:
        return "debug.data_dump.type"
    if debug.run_eagerly:
        return "debug.run_eagerly"
    return None


def _training(example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd will make a forward and a backward graph of these inputs (its own
    rule: grad mode on and an input that requires grad)."""
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs
    )


def graph_cache_key(
    config: CompilerConfig,
    decompositions: Mapping[Any, Callable[..., Any]],
    example_inputs: Sequence[Any],
    observed: bool,
) -> str | None:
    """What a Dynamo graph's entry is keyed by beside AOTAutograd's own key: every option (each
    pass by its identity), the decompositions, airstream's and Python's versions,
    ``$AIRSTREAM_MODE``, the stream costs auto_streams decides with, and the distributed rank.
    None where the graph is not kept (see the module docstring); ``observed``: the backend has
    observers of its own."""
    if (
        observed
        or debugging(config) is not None
        or _training(example_inputs)
        or torch_internals.bundling_compile()  # cache_compile's ahead-of-time compile keys it
        or not torch_internals.autograd_cache_on()
    ):
        return None
    return digest(
        {
            "options": option_identities(config),
            "decompositions": {str(op): pass_identity(fn) for op, fn in decompositions.items()},
            "airstream": airstream_version(),
            "python": platform.python_version(),
            "mode_variable": environment.AIRSTREAM_MODE.read(),
            "costs": costs_field(config),
            "ranks": ranks(),
        }
    )
