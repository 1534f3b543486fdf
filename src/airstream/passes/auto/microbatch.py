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

How: :mod:`airstream.passes.auto.token_dims` labels every value (rows per token, mixed per
micro-batch, or stop); the region is every token-dependent op up to the first that must not run
per micro-batch, shrunk until every value leaving it is rows (concatenated back, ``cat``) or a
size; each region op is copied per micro-batch (sizes that follow the token count follow the
micro-batch's: ``view``, factories, ``all_to_all_single``'s split sizes), the copies ordered
stage by stage (a stage ends at a collective's wait): a0, b0, a1, b1, ..., and every collective
with its wait put on stream ``comm_stream``. Collectives keep one order on every rank: the pass
is deterministic and issues a's before b's at each stage.

The pass keeps the graph as it was (``gm.meta[UNSPLIT_KEY]``): where ``measure_placement``
measures (``"auto"`` does for this pass), the split is timed against the unsplit graph per size
range and kept only where it wins, every rank deciding alike (their times summed first).
"""

from __future__ import annotations

import functools
import logging
import operator
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.effects import effects
from airstream.nodes import describe
from airstream.ops.library import is_air_op
from airstream.passes.auto.token_dims import (
    SCALAR,
    Label,
    Mixed,
    Rows,
    Stop,
    label_nodes,
    rows_of_size,
)
from airstream.passes.toolkit import graph_kind, place_on_stream
from airstream.placements import as_placed
from airstream.torch_internals import collective_op_name, require, static_input_indices

__all__ = ["UNSPLIT_KEY", "MicrobatchSplit", "microbatch_overlap"]

log = logging.getLogger("airstream.passes")

UNSPLIT_KEY = "air_microbatch_unsplit"  # gm.meta: the MicrobatchSplit the pass made
aten = torch.ops.aten

_SIZED = {  # op -> the argument holding a size list whose entries follow the rows
    aten.view.default: 1,
    aten._unsafe_view.default: 1,
    aten.reshape.default: 1,
    aten.expand.default: 1,
    aten.full.default: 0,
    aten.zeros.default: 0,
    aten.ones.default: 0,
    aten.empty.memory_format: 0,
    aten.new_zeros.default: 1,
    aten.new_empty.default: 1,
    aten.new_ones.default: 1,
    aten.new_full.default: 1,
}


@dataclass
class MicrobatchSplit:
    """What the pass did to a graph: the graph as it was (``unsplit``: measured against the
    split, once the built-in passes that follow this one have run on it too), the collectives
    split, and the ops copied per micro-batch."""

    unsplit: torch.fx.GraphModule
    example_inputs: Sequence[Any]  # the graph's, for the passes the unsplit graph still needs
    collectives: int
    region: int
    merged_at: str  # where the micro-batches merge (the first op that is not split, or "output")


class Refused(Exception):
    """The graph cannot be split: the message names the node and why."""


def microbatch_overlap(comm_stream: str | None = "comm", min_tokens: int = 2) -> Any:
    """A pass splitting a graph with collectives into two micro-batches whose communication and
    compute overlap; ``comm_stream``: the stream each collective and its wait run on (None: they
    stay in the micro-batches' order on main; gloo and NCCL collectives run asynchronously
    until their wait either way); ``min_tokens``: a static graph with fewer tokens is left
    alone. A graph that cannot be split is left alone with a warning naming the node and why."""
    require("collectives")

    def microbatch_overlap_pass(
        gm: torch.fx.GraphModule, example_inputs: Sequence[Any], cfg: Any
    ) -> None:
        if not any(effects(n).collective for n in gm.graph.nodes):
            log.info("microbatch_overlap: no collective in the graph; left alone")
            return
        try:
            split = _split(gm, example_inputs, comm_stream, min_tokens)
        except Refused as exc:
            warnings.warn(f"microbatch_overlap left the graph unsplit: {exc}", stacklevel=2)
            return
        if split is not None:
            log.info(
                "microbatch_overlap: %d op(s) and %d collective(s) per micro-batch; merged at %s",
                split.region,
                split.collectives,
                split.merged_at,
            )

    return microbatch_overlap_pass


def _split(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    comm_stream: str | None,
    min_tokens: int,
) -> MicrobatchSplit | None:
    graph = gm.graph
    air = next((n for n in graph.nodes if n.op == "call_function" and is_air_op(n.target)), None)
    if air is not None:
        raise Refused(
            f"{describe(air)} places streams already; register microbatch_overlap before the "
            "passes that place streams (post_grad_custom_pre_pass)"
        )
    tokens, token_node, sources = _tokens(gm)
    if isinstance(tokens, int) and tokens < min_tokens:
        log.info("microbatch_overlap: %d token(s), fewer than %d; left alone", tokens, min_tokens)
        return None
    labels, region, why = _best(graph, sources, tokens)
    collectives = [n for n in graph.nodes if n in region and effects(n).collective]
    if not collectives:
        first = next((n for n in graph.nodes if effects(n).collective), None)
        reason = why.get(first) if first is not None else None
        if reason is None:
            reason = "it does not depend on the tokens"
        raise Refused(
            f"no collective can run per micro-batch. The first, {describe(first)}: "  # type: ignore[arg-type]
            f"{reason}. The pass splits what each token computes from its own rows; move what "
            "mixes tokens after the collectives, or leave this graph unsplit"
        )
    unsplit = as_placed(gm)
    merged_at = _rebuild(gm, labels, region, tokens, token_node, comm_stream)
    split = MicrobatchSplit(unsplit, example_inputs, len(collectives), len(region), merged_at)
    gm.meta[UNSPLIT_KEY] = split
    return split


def _tokens(
    gm: torch.fx.GraphModule,
) -> tuple[Any, torch.fx.Node | None, dict[torch.fx.Node, Label]]:
    """The token count (an int, or the SymInt of a dynamic graph), its placeholder (dynamic),
    and the placeholders' labels: rows where an input's leading size is a multiple of it."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # the parameters: AOTAutograd says for an inference or forward graph; a backward's inputs
    # are saved values and gradients (its context still describes the forward's inputs)
    static = set() if graph_kind(gm) == "backward" else set(static_input_indices() or ())
    data = [
        n
        for i, n in enumerate(placeholders)
        if i not in static and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].dim()
    ]
    if not data:
        raise Refused("no input holds tokens (every tensor input is a parameter or a scalar)")
    leading = [n.meta["val"].shape[0] for n in data]
    symbolic = [s for s in leading if isinstance(s, torch.SymInt) and s.node.expr.is_Symbol]
    if symbolic:
        tokens = symbolic[0]
    else:
        # a static graph: the gradients' leading size in a backward (its other inputs are saved
        # values, weights among them), else the first input's that is not a parameter
        grads = [n for n in data if n.name.startswith("tangents")]
        defining = grads or data[:1]
        counts = Counter(int(n.meta["val"].shape[0]) for n in defining)
        tokens = counts.most_common(1)[0][0]  # type: ignore[assignment]
    token_node = None
    sources: dict[torch.fx.Node, Label] = {}
    for node in placeholders:
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and isinstance(tokens, torch.SymInt):
            if val.node.expr == tokens.node.expr:
                token_node = node
                sources[node] = SCALAR
            elif tokens.node.expr in val.node.expr.free_symbols:
                # a size of the tokens' saved by the forward (``2*s0``): a multiple, scaled
                if rows_of_size(val, tokens) is None:
                    raise Refused(
                        f"input {node.name!r} is the size {val}, derived from the token count "
                        f"{tokens} in a way this pass cannot split"
                    )
                sources[node] = SCALAR
        elif node in data:
            found = _rows_of_input(val, tokens)
            if found is not None:
                sources[node] = found
    if isinstance(tokens, torch.SymInt) and token_node is None:
        raise Refused(f"the token count {tokens} is not an input of the graph")
    return tokens, token_node, sources


def _rows_of_input(val: torch.Tensor, tokens: Any) -> Rows | None:
    """An input's rows: a dynamic graph's at the dimension whose size is a multiple of the token
    count's symbol; a static graph's at the leading dimension where its size is a multiple of
    the count (a weight may be taken for rows: that only splits less, see :func:`_best`)."""
    dims = range(val.dim()) if isinstance(tokens, torch.SymInt) else range(min(1, val.dim()))
    for dim in dims:
        per = rows_of_size(val.shape[dim], tokens)
        if per is not None:
            return Rows(dim, per)
    return None


def _best(
    graph: torch.fx.Graph, sources: dict[torch.fx.Node, Label], tokens: Any
) -> tuple[dict[torch.fx.Node, Label], set[torch.fx.Node], dict[torch.fx.Node, str]]:
    """The labels and region splitting the most collectives (then ops). Any labelling of the
    inputs is sound (an input taken for rows is sliced, and every rule claims rows only where
    each row depends on its own rows of every input; one not taken is shared whole), so a static
    graph, whose sizes cannot tell a token's rows from a weight's that happens to be a multiple
    of the count, tries the inputs of one row per token alone too."""
    tries = [sources]
    if not isinstance(tokens, torch.SymInt):
        tries.append(
            {n: lab for n, lab in sources.items() if not isinstance(lab, Rows) or lab.per == 1}
        )
    best = None
    for tried in tries:
        labels = label_nodes(graph, tried, tokens)
        region, why = _region(graph, labels)
        score = (sum(1 for n in region if effects(n).collective), len(region))
        if best is None or score > best[0]:
            best = (score, labels, region, why)
    assert best is not None
    return best[1], best[2], best[3]


def _region(
    graph: torch.fx.Graph, labels: dict[torch.fx.Node, Label]
) -> tuple[set[torch.fx.Node], dict[torch.fx.Node, str]]:
    """The ops copied per micro-batch, and why each token-dependent op left out was."""
    why: dict[torch.fx.Node, str] = {}
    region: set[torch.fx.Node] = set()
    for node in graph.nodes:
        lab = labels[node]
        if node.op != "call_function" or lab is None or lab == SCALAR:
            continue
        if isinstance(lab, Stop):
            why[node] = f"{lab.why}: {lab.at}" if lab.at else lab.why
            continue
        region.add(node)
    changed = True
    while changed:
        changed = False
        for node in list(graph.nodes):
            if node not in region:
                continue
            lab = labels[node]
            outside = [u for u in node.users if u not in region]
            leaves = _mergeable(node, lab)
            reason = None
            if outside and not leaves:
                reason = f"it depends on a value that is not indexed by tokens: {_what(lab)}"
            late = [a for a in node.all_input_nodes if a not in region and _after(a, region)]
            if late:
                reason = f"it needs {describe(late[0])}, which runs on the whole batch"
            if reason is not None:
                _drop(node, region, why, reason)
                changed = True
    return region, why


def _cat_like(
    graph: torch.fx.Graph, node: torch.fx.Node, parts: list[torch.fx.Node], dim: int
) -> torch.fx.Node:
    """``cat(parts, dim)`` laid out in memory as ``node``'s value was (a transposed value saved
    for the backward keeps its strides: the backward was compiled for them)."""
    val = node.meta.get("val")
    strides = val.stride() if isinstance(val, torch.Tensor) else ()
    order = sorted(range(len(strides)), key=lambda i: -strides[i])  # outermost first
    if not strides or order == list(range(len(strides))) or not _dense(val, order):  # type: ignore[arg-type]
        return graph.call_function(aten.cat.default, (parts, dim))
    moved = [graph.call_function(aten.permute.default, (p, order)) for p in parts]
    joined = graph.call_function(aten.cat.default, (moved, order.index(dim)))
    back = [order.index(i) for i in range(len(order))]
    return graph.call_function(aten.permute.default, (joined, back))


def _dense(val: torch.Tensor, order: list[int]) -> bool:
    """Whether ``val`` is a dense tensor whose dimensions lie in memory in ``order``."""
    expected = 1
    for i in reversed(order):
        if val.shape[i] != 1 and val.stride(i) != expected:
            return False
        expected *= val.shape[i]
    return True


def _mergeable(node: torch.fx.Node, lab: Label) -> bool:
    """Whether the micro-batches' values of ``node`` join into the full one: rows, concatenated,
    or blocks of rows whose other dimensions are static (joined block by block)."""
    if not isinstance(lab, Rows) or lab.fresh:
        return False
    if lab.blocks == 1:
        return True
    shape = node.meta["val"].shape
    return all(isinstance(s, int) for i, s in enumerate(shape) if i != lab.dim)


def _what(lab: Label) -> str:
    if isinstance(lab, Mixed):
        return f"{lab.why}: {lab.at}" if lab.at else lab.why
    if isinstance(lab, Rows):
        return f"{lab.blocks} blocks of rows, one per rank" if lab.blocks > 1 else "a new buffer"
    return "a tuple"


def _after(node: torch.fx.Node, region: set[torch.fx.Node]) -> bool:
    """Whether ``node`` (outside the region) depends on a region op."""
    seen: set[torch.fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n in region:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return False


def _drop(
    node: torch.fx.Node, region: set[torch.fx.Node], why: dict[torch.fx.Node, str], reason: str
) -> None:
    stack = [node]
    while stack:
        n = stack.pop()
        if n in region:
            region.discard(n)
            why.setdefault(n, reason)
            stack.extend(n.users)


def _ordered(node: torch.fx.Node) -> bool:
    found = effects(node)
    return found.collective or found.collective_wait or found.random or bool(found.writes)


def _merged_part(graph: torch.fx.Graph, region: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """The ops that run after the micro-batches, on the merged batch: those that need a region
    op, and ordered ops (collectives, random, writes) that come after the region's first op,
    which must not move before the micro-batches' collectives; and what needs them."""
    out: set[torch.fx.Node] = set()
    started = False
    for node in graph.nodes:
        started = started or node in region
        if node in region or node.op != "call_function":
            continue
        needs = any(a in region or a in out for a in node.all_input_nodes)
        if needs or _after(node, region) or (started and _ordered(node)):
            out.add(node)
    for node in graph.nodes:
        late = [a for a in node.all_input_nodes if a in out]
        if node in region and late:
            raise Refused(
                f"{describe(node)} would run per micro-batch but needs {describe(late[0])}, "
                "which must keep its place after the split"
            )
    return out


def _feeding_collectives(
    graph: torch.fx.Graph, region: set[torch.fx.Node], stage: dict[torch.fx.Node, int]
) -> set[torch.fx.Node]:
    """The region's collectives and, in their stage, the ops they need: run first in a stage, so
    the collective is issued before the stage's other compute."""
    feeds: set[torch.fx.Node] = set()
    for node in reversed(list(graph.nodes)):
        if node not in region:
            continue
        if effects(node).collective or any(
            u in feeds and stage[u] == stage[node] for u in node.users
        ):
            feeds.add(node)
    return feeds


def _stages(graph: torch.fx.Graph, region: set[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """Each region op's stage: the collective waits on its longest path from the inputs."""
    stage: dict[torch.fx.Node, int] = {}
    for node in graph.nodes:
        if node in region:
            before = [stage[a] for a in node.all_input_nodes if a in region]
            stage[node] = max(before, default=0) + (1 if effects(node).collective_wait else 0)
    return stage


def _rebuild(
    gm: torch.fx.GraphModule,
    labels: dict[torch.fx.Node, Label],
    region: set[torch.fx.Node],
    tokens: Any,
    token_node: torch.fx.Node | None,
    comm_stream: str | None,
) -> str:
    """``gm``'s graph rewritten: shared ops, then the micro-batches stage by stage, then the
    merged rest. Returns where they merge."""
    old = gm.graph
    new = torch.fx.Graph(owning_module=gm)
    full: dict[torch.fx.Node, torch.fx.Node] = {}
    micro: tuple[dict[torch.fx.Node, Any], dict[torch.fx.Node, Any]] = ({}, {})
    merged: dict[torch.fx.Node, torch.fx.Node] = {}
    dependent = _merged_part(old, region)

    def copy(node: torch.fx.Node, env: Any, name: str | None = None) -> torch.fx.Node:
        args = torch.fx.map_arg(node.args, env)
        kwargs = torch.fx.map_arg(node.kwargs, env)
        out = new.create_node(node.op, node.target, args, kwargs, name or node.name, node.type)
        out.meta = dict(node.meta)
        return out

    for node in old.nodes:
        if node.op == "placeholder":
            full[node] = copy(node, lambda a: full[a])
    # the micro-batches' token counts
    if token_node is not None:
        half = new.call_function(operator.floordiv, (full[token_node], 2))
        rest = new.call_function(operator.sub, (full[token_node], half))
        counts: tuple[Any, Any] = (half, rest)
    else:
        counts = (tokens // 2, tokens - tokens // 2)

    def scaled(count: Any, per: int) -> Any:
        if per == 1:
            return count
        if isinstance(count, int):
            return count * per
        return new.call_function(operator.mul, (count, per))

    def in_micro(node: torch.fx.Node, i: int) -> Any:
        env = micro[i]
        if node in env:
            return env[node]
        lab = labels.get(node)
        if node is token_node:
            env[node] = counts[i]
        elif node.op == "placeholder" and lab == SCALAR:  # a multiple of the token count
            per = rows_of_size(node.meta["val"], tokens)
            assert per is not None  # checked where the inputs were labelled
            env[node] = scaled(counts[i], per)
        elif node.op == "placeholder" and isinstance(lab, Rows):
            cut = scaled(counts[0], lab.per)  # a's rows end where b's start
            bounds = (0, cut) if i == 0 else (cut, None)
            env[node] = new.call_function(aten.slice.Tensor, (full[node], lab.dim, *bounds))
        elif lab == SCALAR and node.op == "call_function":
            made = copy(node, lambda a: in_micro(a, i), f"{node.name}_mb{i}")
            made.meta.pop("val", None)
            env[node] = made
        else:
            env[node] = full[node]
        return env[node]

    def merged_value(node: torch.fx.Node) -> torch.fx.Node:
        if node in merged:
            return merged[node]
        lab = labels[node]
        assert isinstance(lab, Rows)
        parts = [micro[0][node], micro[1][node]]
        if lab.blocks == 1:
            merged[node] = _cat_like(new, node, parts, lab.dim)
            return merged[node]
        # blocks of rows (one per rank): the micro-batches' rows joined block by block
        shape = list(node.meta["val"].shape)
        blocked = [*shape[: lab.dim], lab.blocks, -1, *shape[lab.dim + 1 :]]
        views = [new.call_function(aten.view.default, (p, blocked)) for p in parts]
        joined = new.call_function(aten.cat.default, (views, lab.dim + 1))
        flat = [*shape[: lab.dim], -1, *shape[lab.dim + 1 :]]
        merged[node] = new.call_function(aten.view.default, (joined, flat))
        return merged[node]

    def in_full(node: torch.fx.Node) -> torch.fx.Node:
        return merged_value(node) if node in region else full[node]

    # shared ops that need no token (weights transposed, sizes): before the micro-batches
    for node in old.nodes:
        if (
            node.op in ("call_function", "get_attr")
            and node not in region
            and node not in dependent
        ):
            full[node] = copy(node, in_full)
    stage = _stages(old, region)
    comm: list[torch.fx.Node] = []
    order = {node: k for k, node in enumerate(old.nodes)}
    feeds = _feeding_collectives(old, region, stage)
    for s in range(max(stage.values(), default=-1) + 1):
        block = [n for n in old.nodes if stage.get(n) == s]
        block.sort(key=lambda n: (n not in feeds, order[n]))  # issue the collective early
        for i in (0, 1):
            for node in block:
                made = copy(node, functools.partial(in_micro, i=i), f"{node.name}_mb{i}")
                made.meta.pop("val", None)
                made.meta.pop("tensor_meta", None)
                if isinstance(tokens, int):
                    _rescale(made, node, labels[node], tokens, counts[i])
                elif collective_op_name(node.target) == "all_to_all_single":
                    _check_splits(node)
                micro[i][node] = made
                if effects(node).collective or effects(node).collective_wait:
                    comm.append(made)
    merged_at = "output"
    for node in old.nodes:
        if node in dependent:
            if merged_at == "output" and node.op == "call_function":
                merged_at = describe(node)
            full[node] = copy(node, in_full)
        elif node.op == "output":
            full[node] = copy(node, in_full)
    gm.graph = new
    if comm_stream is not None:
        place_on_stream(gm, comm, comm_stream)
    new.eliminate_dead_code()
    gm.recompile()
    return merged_at


def _rescale(made: torch.fx.Node, node: torch.fx.Node, lab: Label, tokens: int, count: int) -> None:
    """A static graph's sizes that follow the token count, set to the micro-batch's."""
    out = node.meta.get("val")
    index = _SIZED.get(node.target)  # type: ignore[call-overload]
    if index is not None and isinstance(out, torch.Tensor) and out.dim():
        dim = lab.dim if isinstance(lab, Rows) else 0
        sizes = list(made.args[index])
        per = rows_of_size(out.shape[dim], tokens)
        if per is not None and dim < len(sizes) and sizes[dim] == out.shape[dim]:
            sizes[dim] = per * count
            made.args = (*made.args[:index], sizes, *made.args[index + 1 :])
    elif node.target in (aten.arange.default, aten.arange.start):
        end_at = 0 if node.target is aten.arange.default else 1
        end = made.args[end_at]
        per = rows_of_size(end, tokens) if isinstance(end, int) else None
        if per is not None:
            made.args = (*made.args[:end_at], per * count, *made.args[end_at + 1 :])
    elif collective_op_name(node.target) == "all_to_all_single":
        args = list(made.args)
        for at in (1, 2):
            splits: list[int] = args[at]  # type: ignore[assignment]
            if any(s * count % tokens for s in splits):
                raise Refused(
                    f"{describe(node)}: split sizes {splits} do not scale to {count} of "
                    f"{tokens} tokens; compute them from the token count (or compile with "
                    "dynamic=True)"
                )
            args[at] = [s * count // tokens for s in splits]
        made.args = tuple(args)


def _check_splits(node: torch.fx.Node) -> None:
    """A dynamic graph's all_to_all_single splits must follow the token count (sizes of it)."""
    for at in (1, 2):
        for split in node.args[at]:  # type: ignore[union-attr]
            if isinstance(split, int) and split != 0:
                raise Refused(
                    f"{describe(node)}: split size {split} is a constant while the rows it "
                    "splits follow the token count; compute the split sizes from the tokens"
                )
