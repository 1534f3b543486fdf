"""Which structural roles ``auto_streams`` places, by the cost figures it prints.

Roles come from ``patterns.py``: each shared expert (beside its routing) and each group of
parallel projections (one of its branches beside the others). They are taken in graph order; a
role whose matrix multiplies see more than ``max_tokens`` rows is declined (side streams pay in
decode, not in long prefills), and one is placed when it shortens the predicted time of the
whole graph (``simulate.makespan``, with the syncs the planner would add, the machine's sync
cost and overlap slowdown): for a
projection group, the branch that shortens it most. Each role is one stream reused by every
layer: ``auto_shared`` and ``auto_proj``, or one ``auto_side`` for both when ``max_streams`` is 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch.fx

from airstream.machine.calibration import MachineCosts
from airstream.passes.auto.patterns import parallel_projections, shared_experts
from airstream.passes.auto.pricing import Pricer
from airstream.passes.auto.simulate import makespan

__all__ = ["Placement", "Role", "find_roles", "place_roles"]

Node = torch.fx.Node

_NAMES = {"shared": "shared expert beside routing", "proj": "parallel projections"}


@dataclass(frozen=True)
class Role:
    """One place a side stream may pay: ``options`` are the node sets that could move (one of
    them moves), ``tokens`` the rows their matrix multiplies see."""

    kind: str  # "shared" or "proj"
    options: tuple[tuple[Node, ...], ...]
    tokens: int


@dataclass
class Placement:
    """The roles placed: node -> stream index, index -> label, and the predicted time."""

    where: dict[Node, int] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)
    predicted: float = 0.0
    index: dict[str, int] = field(default_factory=dict)  # kind -> stream index
    placed: dict[str, int] = field(default_factory=dict)  # kind -> how many
    found: dict[str, int] = field(default_factory=dict)
    too_many_tokens: dict[str, list[int]] = field(default_factory=dict)  # kind -> token counts

    def describe(self) -> str:
        """What was placed, e.g. ``shared expert beside routing x4 on auto_side``."""
        parts = []
        for kind, count in self.placed.items():
            label = self.labels[self.index[kind]]
            parts.append(f"{_NAMES[kind]} x{count} of {self.found[kind]} on {label}")
        return ", ".join(parts)

    def declined(self, max_tokens: int) -> str:
        """Why roles found were not placed, one clause per kind (``""``: none declined)."""
        parts = []
        for kind, count in self.found.items():
            if kind in self.too_many_tokens:
                tokens = self.too_many_tokens[kind]
                parts.append(
                    f"{_NAMES[kind]} x{len(tokens)} not placed: {max(tokens)} tokens > "
                    f"max_tokens={max_tokens}"
                )
            elif self.placed.get(kind, 0) < count:
                left = count - self.placed.get(kind, 0)
                parts.append(f"{_NAMES[kind]} x{left} not placed: no predicted gain")
        return "; ".join(parts)


def find_roles(calls: Sequence[Node]) -> list[Role]:
    """Every role in the graph: shared experts first (their linears are not projections)."""
    roles = [Role("shared", (tuple(b.nodes),), b.tokens) for b in shared_experts(calls)]
    taken = {n for role in roles for n in role.options[0]}
    for group in parallel_projections(calls, taken):
        options = tuple(tuple(b) for b in group.branches if b)
        if len(options) >= 2:
            roles.append(Role("proj", options, group.tokens))
    return roles


def place_roles(
    calls: Sequence[Node],
    cost: dict[Node, float],
    roles: Sequence[Role],
    costs: MachineCosts,
    max_streams: int,
    max_tokens: int,
    pricer: Pricer | None = None,
) -> Placement:
    """The roles worth placing, greedily in graph order (see the module docstring); ``pricer``
    prices each placement's syncs (None: one per input from another stream)."""
    kinds = list(dict.fromkeys(r.kind for r in roles))
    separate = max_streams - 1 >= len(kinds)
    index = {kind: (i + 1 if separate else 1) for i, kind in enumerate(kinds)}
    out = Placement(index=index)
    for role in roles:
        out.found[role.kind] = out.found.get(role.kind, 0) + 1
    where: dict[Node, int] = {}

    def predict(placed: dict[Node, int]) -> float:
        waits = pricer.waits(placed) if pricer is not None else None
        return makespan(calls, cost, placed, costs, waits)

    current = predict(where)
    for role in roles:
        if role.tokens > max_tokens:
            out.too_many_tokens.setdefault(role.kind, []).append(role.tokens)
            continue
        best: tuple[float, dict[Node, int]] | None = None
        for option in role.options:
            trial = {**where, **dict.fromkeys(option, index[role.kind])}
            predicted = predict(trial)
            if best is None or predicted < best[0]:
                best = (predicted, trial)
        if best is not None and best[0] < current * (1 - 1e-6):
            current, where = best
            out.placed[role.kind] = out.placed.get(role.kind, 0) + 1
    used = sorted({index[k] for k in out.placed})
    for i in used:
        out.labels[i] = (
            "auto_side" if not separate else f"auto_{next(k for k in kinds if index[k] == i)}"
        )
    out.where = where
    out.predicted = current + costs.side_stream_seconds * len(used)
    return out
