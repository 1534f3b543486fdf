"""The one answer to "which device does this graph compute on", asked by the mode, the executor
and the torch-stream writer alike."""

from __future__ import annotations

import torch
import torch.fx

__all__ = ["graph_device"]


def graph_device(gm: torch.fx.GraphModule) -> torch.device:
    """The accelerator ``gm`` computes on: the device of its first value on neither the CPU nor
    ``meta`` (a CPU input beside CUDA work does not make it a CPU graph); else the CPU."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device.type not in ("cpu", "meta"):
            return val.device
    return torch.device("cpu")
