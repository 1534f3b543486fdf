"""What an FX node does beyond computing its result: the one place that decides it.

Every stage that must know whether an op is random, writes (which) inputs, returns an alias, is a
collective, is an air op or runs as a step asks this module: the planner's ordering rules
(``schedule/deps.py``), the max-autotune segment finder (through ``fusion.py``), CUDA graph
capture, the automatic stream passes and their cost models. A fused max-autotune segment node
carries the summary of its members' effects (``effect_queries.summarize``, stored in
``node.meta["air_effects"]``), so the planner runs once, on the final graph, with the same
answers it would get from the members.

Rules, for an ``OpOverload`` target: *random* means tagged ``nondeterministic_seeded`` (it draws
from a global generator), unless the node's own arguments say it draws nothing: a zero
``dropout_p`` (attention at inference) or ``train=False`` (a dropout op in eval); *writes*
are the arguments its schema marks ``(a!)``; its result
*aliases* the argument whose schema alias set it returns (views, in-place ops), and ``getitem``
and ``air::wait_tensor`` alias their first argument; a *collective* is a
``torch.distributed`` functional collective that starts communication (its ``wait_tensor``
completes one). It *syncs with the host* when tagged ``data_dependent_output`` or
``dynamic_output_shape``. It *allocates* when its result is fresh, uninitialized memory (``empty``,
``empty_like``, ...: two such results are two buffers, never one value). Beyond the schema,
torch's own side-effect rules decide (``torch.fx.node``'s side-effectful functions, ops registered
as effectful, higher-order ops such as ``auto_functionalized`` by their arguments): such a node is
*impure*, kept and never merged or moved. A Python callable with none of these is pure, as in FX.

What an op's schema and tags say is worked out once per op (:func:`_rule`, memoised); a node's
effects map that rule onto its arguments. What the stages ask of the effects (may a node be
dropped, merged, does it run as a step, a segment's effects, storage classes) is in
:mod:`airstream.graph.effect_queries`.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from airstream.graph.foreign_ops import known_effects
from airstream.ops.air_print import air_print
from airstream.ops.library import is_air_op, wait_tensor
from airstream.ops.tagged import TAGGED_EVENT_OPS
from airstream.ops.torch_streams import NATIVE_HOST_SYNCS, NATIVE_OPS
from airstream.torch_internals import (
    OpOverload,
    collective_op_name,
    is_higher_order,
    op_name,
    op_schema,
    torch_side_effects,
)

__all__ = [
    "EFFECTS_KEY",
    "Effects",
    "effects",
    "inplace_variant",
    "nodes_in",
    "written_arguments",
]

EFFECTS_KEY = "air_effects"  # node.meta key: an Effects summary (fused segment nodes)


_aten = torch.ops.aten
# Their result is new, uninitialized memory, not a value computed from the inputs.
_ALLOCATIONS = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_like.default,
        _aten.empty_strided.default,
        _aten.empty_permuted.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
    }
)


@dataclass(frozen=True)
class Effects:
    """The effects of one node.

    Attributes:
        random: draws from a global random generator (its order among random ops matters).
        writes: the input nodes it writes in place.
        aliases: the input nodes whose storage its result (or an element of it) may share.
        view: its result is a view of an input (metadata only: no data is read or written).
        collective: starts a ``torch.distributed`` functional collective.
        collective_wait: completes a functional collective (``_c10d_functional.wait_tensor``).
        air: one of the ``air`` stream ops.
        host_sync: reads device data back to the host (``.item()``, ``nonzero``'s count, any op
            whose output or output shape depends on tensor values): it waits for the device,
            and cannot be captured into a CUDA graph.
        allocates: its result is fresh uninitialized memory (``empty``, ...): never merged.
        impure: torch's own rules say it has an effect beyond its result (an assertion, a
            registered effectful op, a higher-order op wrapping one): kept where it is.
        shared_state: the process-global states it shares with other ops (another library's
            scratch buffer, :mod:`airstream.graph.foreign_ops`; a fused segment's members' states):
            ops sharing one never run at once.
        caller_threads: it must run with the caller's intra-op threads (vLLM's CPU attention):
            on the main stream, while no other stream works.
    """

    random: bool = False
    writes: tuple[torch.fx.Node, ...] = ()
    aliases: tuple[torch.fx.Node, ...] = ()
    view: bool = False
    collective: bool = False
    collective_wait: bool = False
    air: bool = False
    host_sync: bool = False
    allocates: bool = False
    impure: bool = False
    shared_state: tuple[str, ...] = ()
    caller_threads: bool = False

    @property
    def mutates(self) -> bool:
        """Writes to one of its inputs."""
        return bool(self.writes)

    @property
    def ordered(self) -> bool:
        """Its place in program order matters beyond data edges (random, writing, collective)."""
        return self.random or self.mutates or self.collective

    @property
    def pure(self) -> bool:
        """Running it has no effect but its result: safe to run on made-up inputs, to move, to
        drop when unused."""
        return not (self.ordered or self.collective_wait or self.air or self.impure)


_PURE = Effects()


def _arg_value(node: torch.fx.Node, index: int, name: str) -> Any:
    return node.args[index] if index < len(node.args) else node.kwargs.get(name)


def nodes_in(value: Any) -> list[torch.fx.Node]:
    """The nodes in an argument: the node itself, or those in a list or tuple of them."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, torch.fx.Node)]


@dataclass(frozen=True)
class _Rule:
    """What an op's schema and tags say, by argument position: worked out once per op."""

    writes: tuple[tuple[int, str], ...] = ()  # (position, name) of each argument written
    aliases: tuple[tuple[int, str], ...] = ()  # ... of each argument the result may alias
    view: bool = False
    random: bool = False
    # (position, name, default) of an argument whose value can turn the draw off: ``dropout_p``
    # (off at 0) or ``train`` (off at False); the node decides (:func:`_draws`)
    draw_switch: tuple[int, str, Any] | None = None
    collective: str | None = None  # the collective's name (``wait_tensor`` completes one)
    host_sync: bool = False
    allocates: bool = False
    impure: bool = False


@functools.cache
def _rule(target: Any) -> _Rule:
    """The rule of a call target that is not one of airstream's own ops (memoised)."""
    impure = torch_side_effects(target)
    if not isinstance(target, OpOverload):
        return _Rule(impure=impure)
    schema = op_schema(target)
    if schema is None:
        return _Rule(impure=impure)
    writes: list[tuple[int, str]] = []
    aliases: list[tuple[int, str]] = []
    returned = [r.alias_info for r in schema.returns if r.alias_info is not None]
    returned_sets = {s for info in returned for s in info.before_set}
    for i, arg in enumerate(schema.arguments):
        info = arg.alias_info
        if info is None:
            continue
        if info.is_write:
            writes.append((i, arg.name))
        # the result aliases it: the same alias set, or a list of views of it (``a -> *``)
        if returned_sets & set(info.before_set) or "*" in info.after_set or not returned_sets:
            aliases.append((i, arg.name))
    tags = target.tags
    random = torch.Tag.nondeterministic_seeded in tags
    switches = [
        (i, arg.name, arg.default_value)
        for i, arg in enumerate(schema.arguments)
        if arg.name in ("dropout_p", "train")
    ]
    return _Rule(
        writes=tuple(writes),
        aliases=tuple(aliases) if returned else (),
        view=bool(returned) and not writes,
        random=random,
        draw_switch=switches[0] if random and len(switches) == 1 else None,
        collective=collective_op_name(target),
        host_sync=torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags,
        allocates=target in _ALLOCATIONS,
        impure=impure and not writes,  # a written input is the effect torch means
    )


def _draws(node: torch.fx.Node, rule: _Rule) -> bool:
    """Whether a random op's node draws: not with a literal zero ``dropout_p`` or a literal
    ``train=False`` (an argument left out takes the schema's default)."""
    if not rule.random or rule.draw_switch is None:
        return rule.random
    index, name, default = rule.draw_switch
    value = _arg_value(node, index, name)
    if value is None:
        value = default
    if value is None or isinstance(value, torch.fx.Node):  # train=None is training (ATen)
        return True  # or known only when it runs
    return bool(value) if name == "train" else value != 0


def _args_at(node: torch.fx.Node, where: tuple[tuple[int, str], ...]) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    for index, name in where:
        found += nodes_in(_arg_value(node, index, name))
    return list(dict.fromkeys(found))


def effects(node: torch.fx.Node) -> Effects:
    """The effects of ``node`` (pure for placeholders, constants and the output)."""
    if node.op != "call_function":
        return _PURE
    summary = node.meta.get(EFFECTS_KEY)
    if isinstance(summary, Effects):
        return summary
    target = node.target
    if target is operator.getitem:
        return Effects(aliases=tuple(nodes_in(node.args[0])))
    if is_air_op(target):
        waited = tuple(nodes_in(node.args[0])) if target is wait_tensor else ()
        return Effects(air=True, aliases=waited)
    if target in TAGGED_EVENT_OPS or target is air_print:  # steps kept in place and order
        return Effects(air=True)
    if target in NATIVE_OPS:  # the user's own streams and events (on CUDA)
        return Effects(air=True, host_sync=target in NATIVE_HOST_SYNCS)
    if is_higher_order(target):  # its effects depend on what it wraps
        impure = torch_side_effects(target, node.args, node.kwargs)
        known = [known_effects(a) for a in node.args]  # auto_functionalized's op
        state = tuple(dict.fromkeys(s for s, _ in known if s is not None))
        threads = any(t for _, t in known)
        if not (impure or state or threads):
            return _PURE
        return Effects(impure=impure, shared_state=state, caller_threads=threads)
    try:
        rule = _rule(target)
    except TypeError:  # an unhashable callable: no declared effects
        return _PURE
    shares, needs_threads = known_effects(target)
    if rule == _NO_RULE and shares is None and not needs_threads:
        return _PURE
    collective = rule.collective
    aliases = _args_at(node, rule.aliases)
    if collective == "wait_tensor":  # returns the tensor the collective wrote (no annotation)
        aliases = nodes_in(node.args[0])
    return Effects(
        random=_draws(node, rule),
        writes=tuple(_args_at(node, rule.writes)),
        aliases=tuple(aliases),
        view=rule.view,
        collective=collective is not None and collective != "wait_tensor",
        collective_wait=collective == "wait_tensor",
        host_sync=rule.host_sync and not _indexes_by_integers(node),
        allocates=rule.allocates,
        impure=rule.impure,
        shared_state=() if shares is None else (shares,),
        caller_threads=needs_threads,
    )


_NO_RULE = _Rule()


def _indexes_by_integers(node: torch.fx.Node) -> bool:
    """``x[i]`` with integer indices only: its shape follows the indices' shapes, not their
    values (``aten.index`` is tagged data-dependent for boolean masks, which ``nonzero``)."""
    if node.target is not _aten.index.Tensor:
        return False
    indices = _arg_value(node, 1, "indices") or ()
    for index in indices:
        val = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
        if index is not None and (val is None or val.dtype in (torch.bool, torch.uint8)):
            return False
    return True


def written_arguments(op: Any) -> tuple[str, ...]:
    """The names of the arguments ``op`` writes in place (its schema's ``(a!)``)."""
    return tuple(name for _, name in _rule(op).writes)


def inplace_variant(target: Any) -> OpOverload | None:
    """The in-place form of an out-of-place op (``aten.add.Tensor`` -> ``aten.add_.Tensor``):
    same namespace, name + ``_``, same overload, writing its first argument (only) and returning
    it, and taking the same arguments after it. None when there is none, or for random ops."""
    if not isinstance(target, OpOverload) or target.namespace != "aten":
        return None
    return _inplace_variant(target)


@functools.cache
def _inplace_variant(target: OpOverload) -> OpOverload | None:
    rule, schema = _rule(target), op_schema(target)
    if schema is None or not schema.arguments or rule.writes or rule.random:
        return None
    _, name, overload = op_name(target)
    packet = getattr(torch.ops.aten, f"{name}_", None)
    candidate = getattr(packet, overload, None) if packet is not None else None
    inplace = op_schema(candidate) if isinstance(candidate, OpOverload) else None
    if inplace is None or len(inplace.arguments) != len(schema.arguments):
        return None
    if [i for i, _ in _rule(candidate).writes] != [0] or len(inplace.returns) != 1:
        return None
    for a, b in zip(schema.arguments[1:], inplace.arguments[1:], strict=True):
        if a.name != b.name or str(a.type) != str(b.type) or a.kwarg_only != b.kwarg_only:
            return None
    return candidate
