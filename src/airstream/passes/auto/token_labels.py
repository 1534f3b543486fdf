"""The labels :mod:`airstream.passes.auto.token_dims` gives a graph's values: how a value computed
on the whole batch relates to the same value computed on one micro-batch (a slice of the tokens).

* ``None``: it does not depend on the tokens (a parameter, a constant): both micro-batches share it.
* :data:`SCALAR`: an integer derived from the token count (``s0 * 2``). Where it is a size of the
  token dimension (a ``view``'s, a factory's, an ``all_to_all_single``'s splits) each micro-batch
  uses its own count; anywhere else (a fill value, a slice bound, a divisor) it is a value, and
  each micro-batch uses the whole batch's.
* :class:`Rows` ``(dim, per, blocks)``: dimension ``dim`` holds ``per`` rows per token, each a
  function of its own token's rows of every input alone: the whole value is the two
  micro-batches' values concatenated along ``dim``. ``blocks``: the dimension holds that many such
  runs one after another (a token's rows sent to every rank, an ``all_gather``'s result); joined
  block by block. ``fresh``: a new buffer of constants (``zeros``) that takes any layout of as
  many rows. ``by``: the rows are permuted: row ``j`` is the micro-batch's row ``p[j]`` of the
  permutation ``p`` a sort returned (named by its node), and a function of that row alone; such
  values never leave the micro-batch, but a scatter-add by the same positions puts each row back
  at its token (a MoE layer's combine).
* :class:`Positions`: integers that are positions within the micro-batch's rows (an ``arange``
  over them, a sort's indices, either divided by the rows per token): element ``j`` stands for
  row ``p[j]`` of the permutation ``base`` (``""``: row ``j``) and holds the position of the row
  of layout ``of`` that row belongs to. The values differ between the whole batch and a
  micro-batch (b's start at 0), so they are valid only to index the micro-batch's own rows.
* :class:`Mixed`: computed from one micro-batch's tokens but not a slice of the whole value (a
  partial sum over tokens, rows exchanged by a collective of unequal splits): valid per
  micro-batch, never concatenated, and nothing computed from it is rows again.
* :class:`Stop`: an op that must not run per micro-batch (random, a write into a shared buffer,
  capacity dropping, a data-dependent shape): it and what follows run on the merged batch.

Why a split is exact: a value labelled rows is, by induction over the graph, the concatenation of
the micro-batches' values, because every rule claims rows only where each output row is a
function of its own token's rows; a mixed value or positions can make rows again only through a
scatter-add whose source rows stand for the same permutation as its index (each token's rows are
all summed into its own row, in some order), so no value from another token reaches a row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["SCALAR", "Label", "Mixed", "Positions", "Rows", "Stop", "joined", "matches"]


@dataclass(frozen=True)
class Rows:
    """Dimension ``dim`` holds ``blocks`` runs of ``per`` rows per token (``fresh``: constants in
    any layout of that many rows; ``by``: permuted by the sort named so)."""

    dim: int
    per: int = 1
    blocks: int = 1
    fresh: bool = False
    by: str = ""

    @property
    def whole(self) -> bool:
        """The two micro-batches' values concatenate to the whole one."""
        return self.blocks == 1 and not self.fresh and not self.by

    @property
    def layout(self) -> tuple[int, int]:
        """``(per, blocks)``: how the dimension's rows lie, whatever dimension it is."""
        return (self.per, self.blocks)

    def moved(self, dim: int) -> Rows:
        return dataclasses.replace(self, dim=dim)


@dataclass(frozen=True)
class Positions:
    """Positions within the micro-batch's rows laid out as ``of`` (``(per, blocks)``); dimension
    0 stands for the rows of layout ``fine`` in the order of the permutation ``base`` (``""``:
    in order), and every element of one row holds the same position."""

    base: str
    fine: tuple[int, int]
    of: tuple[int, int]


@dataclass(frozen=True)
class Mixed:
    """Per micro-batch, but not a slice of the whole value: ``why``, and ``at``: the op that
    mixed it (for the message that names the node)."""

    why: str
    at: str = ""


@dataclass(frozen=True)
class Stop:
    """Must not run per micro-batch: ``why``, and ``at``: the op that stopped it."""

    why: str
    at: str = ""


SCALAR = "scalar"
Label = None | Rows | Positions | Mixed | Stop | str | tuple  # tuple: one label per output


def matches(a: Rows, b: Rows) -> bool:
    """Whether an elementwise op may combine rows laid out as ``a`` and ``b``: equal, or a fresh
    buffer (in order) beside any rows of as many per token."""
    if a.dim != b.dim:
        return False
    if a.fresh or b.fresh:
        fresh, other = (a, b) if a.fresh else (b, a)
        return not fresh.by and fresh.per * fresh.blocks == other.per * other.blocks
    return a == b


def joined(a: Rows, b: Rows) -> Rows:
    """The layout of an elementwise combination of ``a`` and ``b`` (which :func:`matches`)."""
    return b if a.fresh else a
