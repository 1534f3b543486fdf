"""Built-in pass: rewrite ``view``/``_unsafe_view`` as ``reshape``.

Switch: ``experimental_config.enable_view_optimize`` (default off, as a robustness option).

Before::

    view = aten.view.default(permute, [64, 32])

After::

    reshape = aten.reshape.default(permute, [64, 32])

``view`` fails at run time when its input is not laid out as the trace assumed, which happens
when a custom pass swaps a producer for one with other strides. ``reshape`` returns the same
alias when a view is possible and copies otherwise, so the graph keeps working. The cost is one
extra dispatch per rewritten op. Air ops are never touched and the new node takes the old one's
place and metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

__all__ = ["view_to_reshape"]

aten = torch.ops.aten
_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default})


def view_to_reshape(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> None:
    """Retarget every view/_unsafe_view node to reshape (the node stays where it is)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _VIEWS:
            node.target = aten.reshape.default
