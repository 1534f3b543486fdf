"""Built-in pass: common-subexpression elimination, within one region between air ops.

Switch: ``experimental_config.cse`` (default on).

Before::

    relu = aten.relu.default(x)
    relu_1 = aten.relu.default(x)
    scope_enter = air.scope_enter.default(['_user_stream_label'], ['s1'])
    relu_2 = aten.relu.default(x)           # on stream s1: a different region
    add = aten.add.Tensor(relu, relu_1)

After::

    relu = aten.relu.default(x)
    scope_enter = air.scope_enter.default(['_user_stream_label'], ['s1'])
    relu_2 = aten.relu.default(x)
    add = aten.add.Tensor(relu, relu)

A node is merged into an earlier identical one (same target, same arguments after merging) only
when no air op lies between them: merging across a marker would move work to another stream or
across an event. Only what :func:`airstream.graph.effect_queries.mergeable` allows is merged: no air
op, no op with an effect (mutation, RNG, torch's side-effectful ops), no fresh uninitialized
allocation (``empty``, ``empty_like``, ...: two buffers a custom op writes, which merged would be
one); nor a node with unhashable arguments.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
import torch.fx

from airstream.graph.effect_queries import mergeable
from airstream.passes.regions import region_index

__all__ = ["cse"]


class _Unhashable(Exception):
    pass


def _freeze(value: Any) -> Hashable:
    if isinstance(value, torch.fx.Node):
        return ("node", value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _freeze(v)) for k, v in value.items())))
    if isinstance(value, float) and value != value:  # NaN != NaN: never merge on it
        raise _Unhashable
    try:
        hash(value)
    except TypeError:
        raise _Unhashable from None
    return (type(value).__name__, value)


def cse(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> None:
    """Merge identical pure call_function nodes that lie in the same region."""
    regions = region_index(gm.graph)
    seen: dict[Hashable, torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if not mergeable(node):
            continue
        try:
            key = (
                regions[node],
                node.target,
                _freeze(node.args),
                _freeze(node.kwargs),
            )
        except _Unhashable:
            continue
        earlier = seen.get(key)
        if earlier is None:
            seen[key] = node
            continue
        node.replace_all_uses_with(earlier)
        gm.graph.erase_node(node)
