"""``torch.npu.npugraph_ex``: torch_npu's entry to TorchAir's npugraph_ex package, off the NPU.

``compile_fx(gm, example_inputs, options)`` is npugraph_ex's AOTAutograd graph compiler (for a
backend built with ``aot_module_simplified``): airstream's pipeline with npugraph_ex's config
and its option names. ``scope``, ``inference`` and ``register_replacement`` are TorchAir's own,
as ``torchair`` has them here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from airstream.backend import GraphCompiler
from airstream.compat.torchair import inference, scope
from airstream.compat.torchair.backend import apply_options
from airstream.compat.torchair.config import CompilerConfig
from airstream.compat.torchair.patterns import register_replacement

__all__ = ["compile_fx", "inference", "register_replacement", "scope"]


def compile_fx(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any] | None = None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """Compile an AOTAutograd graph as npugraph_ex does (its graph-capture mode; ``options`` in
    npugraph_ex's names: ``clone_input``, ``inplace_pass``, ``post_grad_custom_pre_pass``, ...)
    and return the callable that runs it."""
    config = CompilerConfig()
    config.mode.value = "npugraph_ex"
    apply_options(config, dict(options or {}))
    return GraphCompiler(config.airstream, None)(gm, list(example_inputs or ()))
