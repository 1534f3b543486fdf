"""A shared-expert MoE block written the way serving stacks write it, in plain PyTorch streams.

SGLang (``alt_stream``), vLLM (its shared-experts stream) and TensorRT-LLM (``aux_stream``) all
overlap a MoE layer's shared expert with its routed experts by hand, in model code::

    current = torch.cuda.current_stream()
    alt_stream.wait_stream(current)           # the side stream starts after the layer's input
    with torch.cuda.stream(alt_stream):
        shared = shared_expert(hidden_states)
    routed = experts(gate(hidden_states))     # meanwhile, on the current stream
    current.wait_stream(alt_stream)           # the sum waits for the shared expert
    return routed + shared

:class:`AltStreamMoe` is that pattern (in airstream's words) around a transformers MoE block
(Qwen2-MoE's or DeepSeek-V3's, the same weights and arithmetic): the model suite's
``qwen2_moe_alt_stream`` and ``bench decode``'s ``alt_stream`` runner compile it, so PyTorch's own
stream IR runs on airstream's streams with no pass at all. On CPU, ``airstream.current_stream``
stands for ``torch.cuda.current_stream()``, and eager PyTorch, which cannot order CPU streams
("cpu backend doesn't support events"), takes the path these stacks take without a side
stream: the block in one piece.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from airstream.ops.torch_streams import current_stream

__all__ = ["AltStreamMoe", "use_alt_stream"]


class AltStreamMoe(torch.nn.Module):
    """A transformers MoE block with its shared expert on ``alt_stream`` (None: one stream)."""

    def __init__(self, block: torch.nn.Module, alt_stream: torch.Stream | None) -> None:
        super().__init__()
        self.block = block
        self.alt_stream = alt_stream

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        alt = self.alt_stream
        if alt is None or not (hidden_states.is_cuda or torch.compiler.is_compiling()):
            return self.block(hidden_states)
        current = current_stream(hidden_states.device)
        alt.wait_stream(current)
        with alt:
            shared = self._shared(hidden_states)
        routed = self._routed(hidden_states)
        current.wait_stream(alt)
        return routed + shared

    def _shared(self, hidden_states: torch.Tensor) -> torch.Tensor:
        block: Any = self.block
        if hasattr(block, "shared_expert_gate"):  # Qwen2-MoE: a gated shared expert
            flat = hidden_states.view(-1, hidden_states.shape[-1])
            gate = F.sigmoid(block.shared_expert_gate(flat))
            return (gate * block.shared_expert(flat)).reshape(hidden_states.shape)
        return block.shared_experts(hidden_states)  # DeepSeek-V3

    def _routed(self, hidden_states: torch.Tensor) -> torch.Tensor:
        block: Any = self.block
        flat = hidden_states.view(-1, hidden_states.shape[-1])
        if hasattr(block, "shared_expert_gate"):
            _, weights, selected = block.gate(flat)
            return block.experts(flat, selected, weights).reshape(hidden_states.shape)
        _, weights, indices = block.gate(hidden_states)
        return block.experts(flat, indices, weights).view(*hidden_states.shape)


def use_alt_stream(model: torch.nn.Module, alt_stream: torch.Stream | None) -> int:
    """Wrap every shared-expert MoE block of ``model`` (transformers Qwen2-MoE, DeepSeek-V3) in
    :class:`AltStreamMoe` with ``alt_stream``, in place; returns how many were wrapped."""
    found = [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(module, "experts")
        and hasattr(module, "gate")
        and (hasattr(module, "shared_expert") or hasattr(module, "shared_experts"))
    ]
    for name, module in found:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, AltStreamMoe(module, alt_stream))
    return len(found)
