"""The decomposition table handed to AOTAutograd.

airstream runs aten ops as eager PyTorch runs them, so by default it adds no decompositions of its
own: AOTAutograd already lowers CompositeImplicitAutograd ops (``linear`` becomes ``t`` +
``addmm``, ``softmax`` becomes ``_softmax``, ...), and the post-grad graph then holds the ops a
profiler of eager mode shows. A pass author sees one node per real kernel, and numerics match
eager bit for bit. Keeping fused kernels (``addmm``, ``native_layer_norm``, ``gelu``) whole is also
faster here than splitting them: every extra op costs a dispatch (~1.4 us on CPU).

Users who want finer ops pass their own table (``get_backend(..., decompositions=...)``), e.g.
``torch.export.default_decompositions()`` (the core aten opset).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airstream.torch_internals import OperatorBase

__all__ = ["DEFAULT_DECOMPOSITIONS", "decomposition_table"]

DEFAULT_DECOMPOSITIONS: Mapping[OperatorBase, Callable[..., Any]] = {}


def decomposition_table(
    extra: Mapping[OperatorBase, Callable[..., Any]] | None = None,
) -> dict[OperatorBase, Callable[..., Any]]:
    """The default table merged with ``extra`` (``extra`` wins)."""
    table = dict(DEFAULT_DECOMPOSITIONS)
    if extra:
        table.update(extra)
    return table
