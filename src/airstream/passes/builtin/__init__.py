"""The built-in passes, in the order they run, each with the option that switches it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airstream.passes.builtin.cse import cse
from airstream.passes.builtin.dead_code_elimination import dead_code_elimination
from airstream.passes.builtin.reinplace import reinplace_inplaceable_ops, reinplace_input_mutations
from airstream.passes.builtin.remove_noop_ops import remove_noop_ops
from airstream.passes.builtin.view_to_reshape import view_to_reshape

__all__ = [
    "BUILTIN_PASSES",
    "FINAL_PASSES",
    "cse",
    "dead_code_elimination",
    "reinplace_inplaceable_ops",
    "reinplace_input_mutations",
    "remove_noop_ops",
    "view_to_reshape",
]

# (option path that enables it, pass), in pipeline order.
BUILTIN_PASSES: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("experimental_config.remove_noop_ops", remove_noop_ops),
    ("experimental_config.enable_view_optimize", view_to_reshape),
    ("experimental_config.cse", cse),
    ("experimental_config.eliminate_dead_code", dead_code_elimination),
)

# Run after the custom post pass, on the graph with its final streams (TorchAir's order).
FINAL_PASSES: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("experimental_config.reinplace_inplaceable_ops", reinplace_inplaceable_ops),
    ("experimental_config.reinplace_input_mutations", reinplace_input_mutations),
)
