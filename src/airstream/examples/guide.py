"""The TorchAir custom-pass guide's example (docs/design.md), as a user writes it.

``Model`` computes ``mm = x @ x``, ``abs(mm) + 1`` and ``x - mm``. ``custom_pre_pass`` puts ``mm``
and ``abs`` on stream ``stream_1``, records an event after ``abs`` and makes ``sub`` wait for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class Model(torch.nn.Module):
    """mm and abs feed add; mm feeds sub."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mm = torch.mm(x, x)
        abs = torch.abs(mm)
        add = torch.add(abs, 1)
        sub = torch.sub(x, mm)
        return add, sub


def custom_pre_pass(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any) -> None:
    """mm and abs on stream_1; sub waits for the record placed after abs."""
    g = gm.graph
    record_node = None
    for node in g.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.mm.default:
            with g.inserting_before(node):  # everything after runs on stream_1
                g.call_function(
                    torch.ops.air.scope_enter.default,
                    args=(["_user_stream_label"], ["stream_1"]),
                )
        if node.op == "call_function" and node.target == torch.ops.aten.abs.default:
            with g.inserting_after(node):
                record_node = g.call_function(torch.ops.air.record.default, args=())
            with g.inserting_after(record_node):
                g.call_function(torch.ops.air.scope_exit.default, args=())
        if node.op == "call_function" and node.target == torch.ops.aten.sub.Tensor:
            with g.inserting_before(node):  # sub starts only after abs has finished
                g.call_function(torch.ops.air.wait.default, args=([record_node],))


def explain_target() -> tuple[Model, tuple[torch.Tensor], Any]:
    """For ``airstream explain airstream.examples.guide:explain_target``."""
    from airstream.options.config import CompilerConfig

    config = CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    return Model(), (torch.randn(64, 64),), config
