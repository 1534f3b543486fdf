"""Built-in pass: dead-code elimination.

Switch: ``experimental_config.eliminate_dead_code`` (default on).

Before::

    mm = aten.mm.default(x, x)
    unused = aten.abs.default(mm)
    record = air.record.default()          # side-effectful: kept even with no users
    add = aten.add.Tensor(mm, 1)
    return (add,)

After::

    mm = aten.mm.default(x, x)
    record = air.record.default()
    add = aten.add.Tensor(mm, 1)
    return (add,)

Uses FX's own ``eliminate_dead_code``: nodes are only erased, never moved. What may go is
:func:`airstream.graph.effect_queries.droppable`'s answer: never an air op, a write, a collective or
an RNG op (removing an unused ``rand`` would shift the random stream of every later op; FX's default
under a tracing context follows Inductor's ``fallback_random`` and would drop it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx

from airstream.graph.effect_queries import droppable

__all__ = ["dead_code_elimination"]


def _has_side_effect(node: torch.fx.Node) -> bool:
    return not droppable(node)


def dead_code_elimination(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any
) -> None:
    """Erase nodes whose results are unused and that have no side effect."""
    gm.graph.eliminate_dead_code(is_impure_node=_has_side_effect)
