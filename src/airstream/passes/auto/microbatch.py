"""``passes.microbatch_overlap()``: a batch split in two so that one half's communication runs
while the other half computes (two-batch overlap, Domino's halves), from the graph.

Before (two tensor-parallel layers; ``x`` holds ``T`` tokens)::

    h1 = all_reduce(mm(gelu(mm(x, w1)), w2)); y1 = wait_tensor(h1) + x
    h2 = all_reduce(mm(gelu(mm(y1, w3)), w4)); out = wait_tensor(h2) + y1

After (``a`` = the first ``T // 2`` tokens, ``b`` = the rest)::

    xa, xb = x[:T//2], x[T//2:]
    ha1 = all_reduce(mm(gelu(mm(xa, w1)), w2))        # comm stream: a's sum ...
    hb1 = all_reduce(mm(gelu(mm(xb, w1)), w2))        # ... while main computes b's layer 1
    ya1 = wait_tensor(ha1) + xa
    ha2 = all_reduce(mm(gelu(mm(ya1, w3)), w4))       # a's layer 2 hides b's first sum
    yb1 = wait_tensor(hb1) + xb
    hb2 = ...
    out = cat([wait_tensor(ha2) + ya1, wait_tensor(hb2) + yb1])

How: :mod:`~airstream.passes.auto.token_dims` labels every value (rows per token, positions,
mixed per micro-batch, a size, or stop); :mod:`~airstream.passes.auto.microbatch_region` finds
what is copied per micro-batch and :mod:`~airstream.passes.auto.microbatch_rebuild` copies it,
stage by stage; :mod:`~airstream.passes.auto.microbatch_check` runs the split graph on fake
tensors before it is kept; and the ranks of the collectives' groups agree on the split
(:mod:`~airstream.passes.auto.rank_agreement`) before any rank keeps it: a rank that refuses
makes every rank refuse, so their collectives still pair.

The pass keeps the graph as it was (``gm.meta[UNSPLIT_KEY]``): where ``measure_placement``
measures (``"auto"`` does for this pass), the split is timed against the unsplit graph per size
range and kept only where it wins, every rank deciding alike; a dynamic graph called with fewer
than ``min_tokens`` tokens runs unsplit.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.graph.devices import graph_device
from airstream.graph.effects import effects
from airstream.graph.mode import resolve_mode
from airstream.graph.nodes import describe
from airstream.graph.placements import as_placed
from airstream.ops.library import is_air_op
from airstream.options.config import CompilerConfig
from airstream.passes.auto.microbatch_check import check_split
from airstream.passes.auto.microbatch_rebuild import Rebuilt, rebuild
from airstream.passes.auto.microbatch_region import (
    Refused,
    Region,
    Tokens,
    find_region,
    find_tokens,
)
from airstream.passes.auto.rank_agreement import collective_groups, digest, same_on_every_rank
from airstream.passes.auto.token_labels import Mixed, Positions, Rows, Stop
from airstream.passes.meta import fake_mode_of, fill_meta
from airstream.passes.toolkit import place_on_stream
from airstream.torch_internals import (
    collective_op_name,
    guards_suppressed,
    require,
    size_hint,
)

__all__ = ["REFUSED_KEY", "UNSPLIT_KEY", "MicrobatchSplit", "microbatch_overlap"]

log = logging.getLogger("airstream.passes")

UNSPLIT_KEY = "air_microbatch_unsplit"  # gm.meta: the MicrobatchSplit the pass made
REFUSED_KEY = "air_microbatch_refused"  # gm.meta: why the pass left the graph unsplit
MIN_TOKENS = 4  # two micro-batches of at least two tokens each


@dataclass
class MicrobatchSplit:
    """What the pass did to a graph: the graph as it was (``unsplit``: measured against the
    split, once the built-in passes that follow this one have run on it too), the collectives
    split of the graph's, the ops copied per micro-batch, where the micro-batches merge and
    why, the process groups the ranks agreed over, and (a dynamic graph) the input that holds
    the token count, below ``min_tokens`` of which a call runs the unsplit graph."""

    unsplit: torch.fx.GraphModule
    example_inputs: Sequence[Any]  # the graph's, for the passes the unsplit graph still needs
    collectives: int
    region: int
    merged_at: str  # where the micro-batches merge (the first op that is not split, or "output")
    total: int = 0  # the graph's collectives
    merged_why: str = ""
    groups: tuple[str, ...] = ()
    token_input: int | None = None
    min_tokens: int = MIN_TOKENS

    def describe(self) -> str:
        """One line: what was split, and where the micro-batches merge."""
        where = "at the output" if self.merged_at == "output" else f"at {self.merged_at}"
        why = f" ({self.merged_why})" if self.merged_why else ""
        return (
            f"split into 2 micro-batches: {self.collectives} of the graph's {self.total} "
            f"collectives hidden behind the other micro-batch, {self.region} ops per "
            f"micro-batch; merged {where}{why}"
        )


@dataclass(frozen=True)
class _Plan:
    tokens: Tokens
    region: Region
    rebuilt: Rebuilt
    collectives: int


def microbatch_overlap(comm_stream: str | None = "comm", min_tokens: int = MIN_TOKENS) -> Any:
    """A pass splitting a graph with collectives into two micro-batches whose communication and
    compute overlap; ``comm_stream``: the stream each collective and its wait run on (None: they
    stay in the micro-batches' order on main; gloo and NCCL collectives run asynchronously
    until their wait either way); ``min_tokens`` (at least 4: no micro-batch of one token): a
    static graph with fewer tokens is left alone, a dynamic one called with fewer runs unsplit.
    A graph that cannot be split is left alone with a warning naming the op and why."""
    require("collectives")
    if not isinstance(min_tokens, int) or min_tokens < MIN_TOKENS:
        raise ValueError(
            f"microbatch_overlap(min_tokens={min_tokens!r}): min_tokens must be an int of at "
            f"least {MIN_TOKENS}, so that each micro-batch holds at least 2 tokens"
        )

    def microbatch_overlap_pass(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any
    ) -> None:
        total = sum(1 for n in gm.graph.nodes if effects(n).collective)
        if not total:
            log.info("microbatch_overlap: no collective in the graph; left alone")
            return
        groups = collective_groups(gm.graph)
        try:
            plan: _Plan | str = _plan(gm, min_tokens, _specializes(gm, cfg))
        except Refused as exc:
            plan = str(exc)
        except Exception:  # a bug here: every rank must still reach the agreement (and refuse)
            same_on_every_rank(digest(["failed"]), groups)
            raise
        mine = digest(_decision(plan))
        if not same_on_every_rank(mine, groups):
            said = f"split it ({_summary(plan)})" if isinstance(plan, _Plan) else f"not: {plan}"
            plan = (
                f"the ranks of process group(s) {', '.join(groups)} did not all reach the same "
                f"split (this rank would {said}); every rank leaves it unsplit, so that their "
                "collectives still pair. Give every rank the same graph and token count"
            )
        if isinstance(plan, str):
            gm.meta[REFUSED_KEY] = plan
            if not plan.startswith("left alone:"):
                warnings.warn(f"microbatch_overlap left the graph unsplit: {plan}", stacklevel=2)
            return
        split = _apply(gm, plan, example_inputs, comm_stream, total, groups, min_tokens)
        log.info("microbatch_overlap: %s", split.describe())
        if split.collectives < total:
            warnings.warn(f"microbatch_overlap: {split.describe()}", stacklevel=2)

    return microbatch_overlap_pass


def _specializes(gm: torch.fx.GraphModule, cfg: Any) -> bool:
    """Whether ``gm`` compiles into kernels whose sizes follow their example sizes
    (max-autotune's segments: a micro-batch of one token at the example compiles for one)."""
    if not isinstance(cfg, CompilerConfig):
        return True
    return resolve_mode(cfg, graph_device(gm).type) == "max-autotune"


def _plan(gm: torch.fx.GraphModule, min_tokens: int, specializes: bool = True) -> _Plan | str:
    """The split of ``gm`` (built, checked, not yet applied), or why it is left alone.
    ``specializes``: see :func:`_specializes`."""
    graph = gm.graph
    air = next((n for n in graph.nodes if n.op == "call_function" and is_air_op(n.target)), None)
    if air is not None:
        raise Refused(
            f"{describe(air)} places streams already; register microbatch_overlap before the "
            "passes that place streams (post_grad_custom_pre_pass)"
        )
    tokens = find_tokens(gm)
    if isinstance(tokens.count, int) and tokens.count < min_tokens:
        return f"left alone: {tokens.count} token(s), fewer than min_tokens={min_tokens}"
    example = size_hint(tokens.count, fallback=min_tokens)
    if specializes and example < min_tokens:
        raise Refused(
            f"the graph compiles with dynamic tokens at an example of {example} token(s), fewer "
            f"than min_tokens={min_tokens}: max-autotune's kernels would be built for "
            f"micro-batches of {example // 2} token(s) and fail at larger counts. Make the "
            f"graph's first call (its compile) with at least {min_tokens} tokens"
        )
    refusal: Refused | None = None
    for region in find_region(graph, tokens):  # the best first; the next where it fails
        try:
            return _split_by(gm, tokens, region)
        except Refused as exc:
            refusal = refusal or exc
    assert refusal is not None
    raise refusal


def _split_by(gm: torch.fx.GraphModule, tokens: Tokens, region: Region) -> _Plan:
    graph = gm.graph
    collectives = [n for n in graph.nodes if n in region.nodes and effects(n).collective]
    if not collectives:
        first = next(n for n in graph.nodes if effects(n).collective)
        reason = region.why.get(first) or "it does not depend on the tokens"
        raise Refused(
            f"no collective can run per micro-batch. The first, {describe(first)}: {reason}. "
            "The pass splits what each token computes from its own rows; move what mixes "
            "tokens after the collectives, or leave this graph unsplit"
        )
    rebuilt = rebuild(gm, tokens, region)
    check_split(gm, rebuilt, tokens, region)
    return _Plan(tokens, region, rebuilt, len(collectives))


def _decision(plan: _Plan | str) -> list[Any]:
    """What every rank must agree on: whether to split, and the collectives the split issues
    in order (their ops, groups and static sizes), from which the rest follows."""
    if isinstance(plan, str):
        return ["unsplit"]
    count = plan.tokens.count
    parts: list[Any] = ["split", count if isinstance(count, int) else "dynamic"]
    parts.append(len(plan.region.nodes))
    for node in plan.rebuilt.comm:
        static = [a for a in node.args if isinstance(a, (int, str, list, tuple))]
        parts.append((collective_op_name(node.target), repr(static)))
    return parts


def _summary(plan: _Plan) -> str:
    return f"{plan.collectives} collectives, {len(plan.region.nodes)} ops per micro-batch"


def _apply(
    gm: torch.fx.GraphModule,
    plan: _Plan,
    example_inputs: Sequence[Any],
    comm_stream: str | None,
    total: int,
    groups: tuple[str, ...],
    min_tokens: int,
) -> MicrobatchSplit:
    unsplit = as_placed(gm)
    merged = plan.rebuilt.merged_at
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    token_node = plan.tokens.node
    split = MicrobatchSplit(
        unsplit,
        example_inputs,
        plan.collectives,
        len(plan.region.nodes),
        "output" if merged is None else describe(merged),
        total=total,
        merged_why="" if merged is None else _why_merged(plan, merged),
        groups=groups,
        token_input=None if token_node is None else placeholders.index(token_node),
        min_tokens=min_tokens,
    )
    gm.graph = plan.rebuilt.graph
    if comm_stream is not None:
        place_on_stream(gm, plan.rebuilt.comm, comm_stream)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    # the copies' metadata, without the guards torch's shape checks would record on the
    # micro-batches' sizes (``s0 // 2 != 1``: every count of 2 or 3 would compile anew, though
    # such calls run the graph unsplit)
    with guards_suppressed(fake_mode_of(example_inputs)):
        fill_meta(gm, example_inputs)
    gm.meta[UNSPLIT_KEY] = split
    return split


def _why_merged(plan: _Plan, node: torch.fx.Node) -> str:
    """Why the first op after the micro-batches is not copied per micro-batch."""
    if node in plan.region.why:
        return plan.region.why[node]
    lab = plan.region.labels.get(node)
    if isinstance(lab, (Stop, Mixed)):
        return f"{lab.why}: {lab.at}" if lab.at else lab.why
    if isinstance(lab, (Rows, Positions)) or lab is None:
        return "it needs a value of the merged batch"
    return ""
