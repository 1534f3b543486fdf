"""The size range of a call of a graph compiled with dynamic sizes: each size symbol (``s0``
tokens) read from the call's arguments, where the graph's inputs bind it, and put in its range
(``stream_config.measure_ranges``): powers of two by default (``s0 in 1``, ``s0 in 2..3``,
``s0 in 4..7`` ...), or the ranges a user's bounds cut (``(1, 256)``: ``s0 in 0..1``,
``s0 in 2..256``, ``s0 in 257..``). :mod:`airstream.runtime.measured` keeps a decision per
range: decode and prefill steps of one graph differ in what streams gain."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream import torch_internals

__all__ = ["SizeRanges", "SizeSource", "one_size_per_range", "size_ranges", "size_sources"]


@dataclass(frozen=True)
class SizeSource:
    """Where a call's arguments give a size symbol: argument ``index`` itself (a symbolic int),
    or its dimension ``dim`` (a tensor)."""

    symbol: str
    index: int
    dim: int | None

    def read(self, args: Sequence[Any]) -> int:
        """The symbol's value in a call with ``args``."""
        value = args[self.index]
        return int(value if self.dim is None else value.shape[self.dim])

    def __str__(self) -> str:
        where = f"input {self.index}" if self.dim is None else f"input {self.index}, dim {self.dim}"
        return f"{self.symbol} ({where})"


def size_sources(gm: torch.fx.GraphModule) -> list[SizeSource]:
    """Each size symbol the graph's inputs bind (a symbolic int input, or a tensor input's
    dimension that is the symbol itself), at its first place, in symbol order."""
    found: dict[str, SizeSource] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        value = node.meta.get("val")
        sizes = value.shape if isinstance(value, torch.Tensor) else (value,)
        for dim, size in enumerate(sizes):
            symbol = torch_internals.plain_symbol(size)
            if symbol is not None and str(symbol) not in found:
                where = dim if isinstance(value, torch.Tensor) else None
                found[str(symbol)] = SizeSource(str(symbol), index, where)
    return sorted(found.values(), key=lambda s: (len(s.symbol), s.symbol))


class SizeRanges:
    """A call's size range as text (``"s0 in 4..7"``): the key of its decision."""

    def __init__(self, sources: Sequence[SizeSource], bounds: Sequence[int] | None) -> None:
        self.sources = tuple(sources)
        self.bounds = None if bounds is None else tuple(sorted(bounds))

    def __call__(self, args: Sequence[Any]) -> str:
        return ", ".join(f"{s.symbol} in {self.range_of(s.read(args))}" for s in self.sources)

    def range_of(self, size: int) -> str:
        """The range ``size`` falls in."""
        if self.bounds is None:  # powers of two: [2**k, 2**(k+1) - 1]
            if size <= 1:
                return str(size)
            low = 1 << (size.bit_length() - 1)
            return f"{low}..{2 * low - 1}"
        at = bisect.bisect_left(self.bounds, size)
        low = self.bounds[at - 1] + 1 if at > 0 else 0
        if at == len(self.bounds):
            return f"{low}.."
        high = self.bounds[at]
        return str(high) if low == high else f"{low}..{high}"

    def describe(self) -> str:
        """What the ranges are of, as a report says it."""
        cut = "powers of two" if self.bounds is None else f"bounds {list(self.bounds)}"
        return f"{', '.join(map(str, self.sources))} by {cut}"


def one_size_per_range(bounds: Sequence[int] | None, top: int) -> list[int]:
    """A size in every range from 1 to ``top`` (each range's lowest, and ``top``): the calls a
    warm-up makes so that every range a server will call is measured before it serves.
    ``bounds``: ``stream_config.measure_ranges`` as a tuple (None: powers of two)."""
    if bounds is None:
        lows = [1 << k for k in range(top.bit_length())]
    else:
        lows = [1, *(b + 1 for b in sorted(bounds))]
    return sorted({*(n for n in lows if 1 <= n <= top), top})


def size_ranges(gm: torch.fx.GraphModule, bounds: Sequence[int] | None) -> SizeRanges | None:
    """The graph's size ranges, or None for a graph with no size symbol (static)."""
    sources = size_sources(gm)
    return SizeRanges(sources, bounds) if sources else None
