"""Drawing a random program for the ``microbatch_overlap`` fuzzer: the inputs and token counts
(:func:`draw_program`), then the steps, one op family at a time
(:class:`airstream.selftest.microbatch_ops.Draw`), until a collective is among them."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from airstream.selftest.microbatch_ops import Draw
from airstream.selftest.microbatch_programs import (
    OP_WEIGHTS,
    MicrobatchProgram,
    Skip,
    Step,
    Sz,
    TensorSpec,
    Value,
)

__all__ = ["draw_program", "draw_steps"]


def draw_steps(
    rng: random.Random, world: int, inputs: Sequence[TensorSpec], prog: dict[str, Any]
) -> tuple[tuple[Step, ...], tuple[TensorSpec, ...], tuple[str, ...], bool]:
    """Steps (3 to ``prog["max_steps"]``, a collective among them), the parameters they use,
    the outputs (one to three values) and whether the program is splittable."""
    d = Draw(rng, world, prog)
    for s in inputs:
        dtype, kind = ("i" if s.dtype == "int64" else "f"), "shared" if s.name == "w_in" else "rows"
        d.vals.append(Value(s.name, s.shape, dtype, kind, high=s.high))
    want, names, weights = (
        rng.randint(3, prog["max_steps"]),
        list(OP_WEIGHTS),
        list(OP_WEIGHTS.values()),
    )
    for _ in range(40 * want + 100):
        done = len(d.steps) >= want
        if done and any(s.collective for s in d.steps):
            break
        params, maps = len(d.params), d.maps
        try:
            getattr(d, "collective" if done else rng.choices(names, weights)[0])()
        except Skip:
            del d.params[params:]
            d.maps = maps
    live = [s.defines for s in d.steps if s.defines not in d.dead]
    outs = {live[-1], *rng.sample(live, min(len(live), rng.randint(0, 2)))}
    floats = [v.name for v in d.vals if v.dtype == "f" and v.name in live]
    if prog["training"] and floats and not outs & set(floats):
        outs.add(floats[-1])
    return tuple(d.steps), tuple(d.params), tuple(n for n in live if n in outs), d.splittable


def draw_program(
    rng: random.Random,
    world: int = 1,
    dynamic: bool | None = None,
    training: bool | None = None,
    max_steps: int = 12,
) -> MicrobatchProgram:
    """A random program for ``world`` ranks (``dynamic`` and ``training`` drawn where None)."""
    dynamic = rng.random() < 0.5 if dynamic is None else dynamic
    training = rng.random() < 0.4 if training is None else training
    options = ((4, 6, 8, 12, 16), (0, 0, 0, 1, 2, 3), (4, 6, 10), (4, 6, 10))
    h, a, h2, n = (rng.choice(c) for c in options)  # hidden, x's middle dim (0: none), y's, w_in's
    has_y, has_ids, has_w = (rng.random() < p for p in (0.3, 0.3, 0.15))
    tokens: tuple[int, ...] = (rng.randint(4, 13),)
    if dynamic:  # compiled at a count unlike every other input size (Dynamo's duck sizing)
        sizes = rng.sample((2, 3, 5, 8, 11), rng.randint(2, 3))
        first = [s for s in sizes if s not in {h, a, has_y and h2, has_w and n}]
        first.sort(key=lambda s: s < 5 and rng.random() < 0.8)  # mostly halves of 2 or more
        tokens = tuple(sorted(sizes, key=lambda s: s != first[0])) if first else (7, *sizes)
    t: Sz = (1, 0)
    inputs = [TensorSpec("x", (t, *([(0, a)] if a else []), (0, h)))]
    inputs += [TensorSpec("y", (t, (0, h2)))] * has_y
    inputs += [TensorSpec("ids", (t,), "int64", high=min(tokens))] * has_ids
    inputs += [TensorSpec("w_in", ((0, h), (0, n)), scale=h**-0.5)] * has_w
    prog = {"tokens": tokens, "dynamic": dynamic, "training": training, "max_steps": max_steps}
    steps, params, outputs, splittable = draw_steps(rng, world, inputs, prog)
    return MicrobatchProgram(
        tuple(inputs), params, steps, outputs, tokens, dynamic, training, world, splittable
    )
