"""Built-in passes: do out-of-place work in place where nothing can tell the difference.

They run last, after the custom post pass, on the graph with its final streams (the pipeline's
``builtin_final`` stage). Both are off by default; the TorchAir compat layer turns them on in
``reduce-overhead`` (TorchAir's aclgraph mode), as TorchAir does.

``reinplace_inplaceable_ops`` (``experimental_config.reinplace_inplaceable_ops``)::

    clone = aten.clone.default(x)              clone = aten.clone.default(x)
    add = aten.add.Tensor(clone, 1)    ->      add_ = aten.add_.Tensor(clone, 1)

An op with an in-place form (:func:`airstream.graph.effects.inplace_variant`) writes its first
argument when that argument is a temporary: no graph input or parameter shares its memory, nothing
reads it (or a view of it) afterwards, it is not an output, and its layout is the result's.

``reinplace_input_mutations`` (``experimental_config.reinplace_input_mutations``)::

    mul = aten.mul.Tensor(y, 2)                mul_ = aten.mul_.Tensor(y, 2)
    copy_ = aten.copy_.default(y, mul)   ->

An input mutation's write-back (``copy_`` into a graph input) is folded into the op that computes
the new value when that op has an in-place form and reads the input as its first argument; a
custom op called through ``auto_functionalized_v2`` is called directly (in reduce-overhead: in
max-autotune, Inductor calls it in place inside a segment) when every tensor it
writes is a whole graph input written back after it, or a temporary (all of it, or a slice or
strided view of it, made before the call: vLLM's ``out=`` ops, its rotary embedding writing the
query and key slices of one projection) that nothing reads afterwards. When the value comes from
an op on a temporary instead (``add(mul, 1)``), that op is made in place as above and the copy
stays.

Either way, only where every other reader of the written memory runs on the writer's stream: a
write on one stream to memory another stream reads would make the planner add an event between
them and take the overlap away (the planner orders such writes after those reads, so this is
about speed; correctness never depends on it). Nodes keep their place, stream annotations and
source lines.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from airstream import torch_internals
from airstream.errors import StreamError
from airstream.graph.devices import graph_device
from airstream.graph.effect_queries import alias_classes
from airstream.graph.effects import effects, inplace_variant
from airstream.graph.mode import resolve_mode
from airstream.graph.streams import assign_streams
from airstream.options.config import CompilerConfig
from airstream.torch_internals import outputs_rebuilt_from_inputs

__all__ = ["reinplace_inplaceable_ops", "reinplace_input_mutations"]

aten = torch.ops.aten


class _Facts:
    """Graph order, storage classes (and their members) and every node's stream: worked out once
    per pass and kept up to date through each rewrite (:meth:`swap`, :meth:`erased`), not
    rebuilt."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.labels: dict[str, str | None] = dict(assign_streams(gm).stream_of)
        self.refresh(gm)

    def refresh(self, gm: torch.fx.GraphModule) -> None:
        """Order, storage classes and outputs from the graph (the stream labels are kept)."""
        graph = gm.graph
        self.order = {node: i for i, node in enumerate(graph.nodes)}
        self.classes = alias_classes(graph)
        self.members: dict[torch.fx.Node, list[torch.fx.Node]] = defaultdict(list)
        for node, root in self.classes.items():
            self.members[root].append(node)
        output = graph.output_node()
        values = output.args[0] if isinstance(output.args[0], list | tuple) else (output.args[0],)
        backward = any(p.name.startswith("tangents") for p in graph.find_nodes(op="placeholder"))
        rebuilt = frozenset() if backward else outputs_rebuilt_from_inputs(len(values))
        # outputs the caller receives as they are (not rebuilt from an input at run time)
        self.owned = {v for i, v in enumerate(values) if i not in rebuilt}

    def swap(self, old: torch.fx.Node, new: torch.fx.Node, written: torch.fx.Node) -> None:
        """``new`` now stands where ``old`` stood, on its stream, writing ``written`` in place
        and returning it: ``old``'s storage (its views) becomes ``written``'s."""
        self.order[new] = self.order.pop(old)
        self.labels[new.name] = self.labels.get(old.name)
        into = self.classes[written]
        moved = self.members.pop(self.classes[old]) if self.classes[old] is not into else []
        for member in moved:
            self.classes[member] = into
        self.members[into] += [m for m in moved if m is not old] + [new]
        self.members[into] = [m for m in self.members[into] if m is not old]
        self.classes[new] = into
        del self.classes[old]
        if old in self.owned:
            self.owned.discard(old)
            self.owned.add(new)

    def erased(self, node: torch.fx.Node, replacement: torch.fx.Node) -> None:
        """``node`` (a write-back whose users now use ``replacement``) left the graph."""
        self.order.pop(node, None)
        root = self.classes.pop(node)
        self.members[root] = [m for m in self.members[root] if m is not node]
        if node in self.owned:
            self.owned.discard(node)
            self.owned.add(replacement)

    def stream(self, node: torch.fx.Node) -> str | None:
        return self.labels.get(node.name)

    def returned(self, value: torch.fx.Node) -> bool:
        """Is ``value``, or a view or in-place result of it, an output the caller receives as it
        is? (An output AOTAutograd rebuilds as a view of an input, such as ``x.view(-1)`` after
        ``x.add_(1)``, is not: it aliases the input in eager PyTorch too.)"""
        seen, todo = {value}, [value]
        while todo:
            node = todo.pop()
            if node in self.owned:
                return True
            for user in node.users:
                if user not in seen and any(a in seen for a in effects(user).aliases):
                    seen.add(user)
                    todo.append(user)
        return False

    def is_input_memory(self, value: torch.fx.Node) -> bool:
        return any(m.op in ("placeholder", "get_attr") for m in self.members[self.classes[value]])

    def copies_into(self, value: torch.fx.Node) -> list[torch.fx.Node]:
        """The write-backs (``copy_`` into a graph input) into ``value``."""
        return [u for u in value.users if _write_back(u) is not None and u.args[0] is value]

    def confined(
        self,
        value: torch.fx.Node,
        writer: torch.fx.Node,
        *,
        ignore: Any = (),
        until: torch.fx.Node | None = None,
    ) -> bool:
        """May ``writer`` overwrite ``value``'s memory: nothing after it reads that memory and
        every other reader runs on ``writer``'s stream (air ops, which order streams, never
        do)? Where the memory was made does not matter: ``writer`` reads it, so runs after."""
        stream = self.stream(writer)
        members = [m for m in self.members[self.classes[value]] if m not in ignore]
        for reader in (u for m in members for u in m.users):
            if reader is writer or reader in ignore:
                continue
            if until is not None and self.order.get(reader, -1) > self.order[until]:
                continue  # reads the value written back at ``until``: the same either way
            if reader.op == "output" or self.order[reader] > self.order[writer]:
                return False
            if reader.op != "call_function" or effects(reader).air:
                return False
            if self.stream(reader) != stream:
                return False
        return True


def _same_layout(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Do ``a`` and ``b`` hold tensors of one size, stride, dtype and device?"""
    x, y = a.meta.get("val"), b.meta.get("val")
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        return False
    return x.dtype == y.dtype and x.device == y.device and _known_equal(x, y)


def _known_equal(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Same size and stride, provably, without a guard on a symbolic size (a pass must not
    specialize a dynamic shape)."""
    pairs = [*zip(x.shape, y.shape, strict=False), *zip(x.stride(), y.stride(), strict=False)]
    return x.dim() == y.dim() and all(statically_known_true(a == b) for a, b in pairs)


def _name(target: Any) -> str:
    """A node name for ``target`` as AOTAutograd names them (``mul_``, not ``mul__tensor``)."""
    return torch_internals.op_name(target)[1]


def _in_place(
    gm: torch.fx.GraphModule, node: torch.fx.Node, target: Any, args: tuple[Any, ...]
) -> torch.fx.Node:
    """Put ``target(*args, **node.kwargs)`` (in place on ``args[0]``) where ``node`` is, with
    its metadata (stream annotations, source line), and make it stand for ``node``."""
    with gm.graph.inserting_before(node):
        new = gm.graph.create_node(
            "call_function", target, args, dict(node.kwargs), name=_name(target)
        )
    new.meta.update(node.meta)
    new.meta["val"] = args[0].meta["val"]  # an in-place op returns the tensor it wrote
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
    return new


def _writable_first_arg(node: torch.fx.Node, facts: _Facts) -> torch.fx.Node | None:
    """``node``'s first argument, when an in-place form could write it: a tensor node with the
    result's layout that no other argument shares memory with."""
    if node.op != "call_function" or inplace_variant(node.target) is None or not node.args:
        return None
    first = node.args[0]
    if not isinstance(first, torch.fx.Node) or not _same_layout(first, node):
        return None
    others = [a for a in node.all_input_nodes if a is not first]
    others += [a for a in node.args[1:] if a is first]  # op(x, x): x read while written
    if any(facts.classes[a] == facts.classes[first] for a in others):
        return None
    return first


def _reinplace_temporary(gm: torch.fx.GraphModule, node: torch.fx.Node, facts: _Facts) -> bool:
    """Make ``node`` in place on its first argument if that is a dead temporary."""
    first = _writable_first_arg(node, facts)
    if first is None or first.op != "call_function" or facts.is_input_memory(first):
        return False
    if not facts.confined(first, node):
        return False
    target = inplace_variant(node.target)
    assert target is not None
    facts.swap(node, _in_place(gm, node, target, tuple(node.args)), first)
    return True


def _facts(gm: torch.fx.GraphModule) -> _Facts | None:
    try:
        return _Facts(gm)
    except StreamError:  # an invalid stream program: reported, with its context, when planned
        return None


def reinplace_inplaceable_ops(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    config: Any,
) -> None:
    """Rewrite ops on dead temporaries as their in-place forms (see the module docstring)."""
    facts = _facts(gm)
    if facts is None:
        return
    for node in list(gm.graph.nodes):
        _reinplace_temporary(gm, node, facts)


def _write_back(node: torch.fx.Node) -> tuple[torch.fx.Node, torch.fx.Node] | None:
    """``(input, value)`` when ``node`` is ``copy_(input, value)`` into a graph input."""
    if node.op != "call_function" or node.target is not aten.copy_.default or node.kwargs:
        return None
    dst, src = node.args[0], node.args[1]
    if not isinstance(dst, torch.fx.Node) or not isinstance(src, torch.fx.Node):
        return None
    if dst.op != "placeholder" or not _same_layout(dst, src):
        return None
    return dst, src


def _fold_into_op(
    gm: torch.fx.GraphModule,
    copy: torch.fx.Node,
    dst: torch.fx.Node,
    src: torch.fx.Node,
    facts: _Facts,
) -> bool:
    """``src = op(dst, ...)``, ``copy_(dst, src)`` -> ``op_(dst, ...)``."""
    if _writable_first_arg(src, facts) is not dst or facts.order[src] > facts.order[copy]:
        return False
    if facts.returned(src):  # an output the caller owns: it must not become the input
        return False
    if not facts.confined(dst, src, ignore={copy}):
        return False
    target = inplace_variant(src.target)
    assert target is not None
    new = _in_place(gm, src, target, tuple(src.args))
    facts.swap(src, new, dst)
    copy.replace_all_uses_with(new)
    gm.graph.erase_node(copy)
    facts.erased(copy, new)
    return True


def _returns(op: Any) -> int:
    """How many values ``op`` returns."""
    schema = torch_internals.op_schema(op)
    return len(schema.returns) if schema is not None else 0


def _fold_into_call(gm: torch.fx.GraphModule, node: torch.fx.Node, facts: _Facts) -> bool:
    """``auto_functionalized_v2(op, ...)`` -> ``op(...)`` writing each base in place.

    A base that is a graph input qualifies when a later ``copy_`` writes it back (the caller sees
    the input change anyway) and nothing reads its old value before the last such copy; a
    temporary when nothing reads it afterwards. Chains of calls writing one input fold one by one,
    and the final write-back, now a copy of the input onto itself, goes.
    """
    call = torch_internals.functionalized_call(node)
    if call is None:
        return False
    results: dict[int, torch.fx.Node] = {}
    for user in node.users:
        if user.target is not operator.getitem or not isinstance(user.args[1], int):
            return False
        results[user.args[1]] = user
    if not _returns(call.op) and results.get(0) is not None and results[0].users:
        return False  # the op returns nothing, yet its None is used
    if len({facts.classes[b] for b in call.bases}) != len(call.bases):
        return False  # two bases share memory (CSE merges equal temporaries): writes would mix
    for i, base in enumerate(call.bases):
        value = results.get(call.returns + i)
        if base.op == "placeholder":
            backs = [c for c in facts.copies_into(base) if facts.order[c] > facts.order[node]]
            if not backs or (value is not None and facts.returned(value)):
                return False
            last = max(backs, key=facts.order.__getitem__)
            if not facts.confined(base, node, ignore=set(backs), until=last):
                return False
        elif base.op != "call_function" or facts.is_input_memory(base):
            return False
        elif not facts.confined(base, node):
            return False
    kwargs = dict(call.kwargs)
    with gm.graph.inserting_before(node):
        for name, (view_op, view_args) in call.views.items():  # the view the op writes
            view = gm.graph.call_function(view_op, view_args)
            view.meta.update({k: v for k, v in node.meta.items() if k != "val"})
            facts.labels[view.name] = facts.stream(node)
            kwargs[name] = view
        direct = gm.graph.create_node("call_function", call.op, (), kwargs, name=_name(call.op))
    direct.meta.update({k: v for k, v in node.meta.items() if k != "val"})
    facts.labels[direct.name] = facts.stream(node)
    for index, result in results.items():
        if index < call.returns:
            if call.returns == 1:
                result.replace_all_uses_with(direct)
            else:
                with gm.graph.inserting_before(result):
                    item = gm.graph.call_function(operator.getitem, (direct, index))
                item.meta.update({k: v for k, v in result.meta.items() if k != "val"})
                facts.labels[item.name] = facts.stream(node)
                result.replace_all_uses_with(item)
        else:
            base = call.bases[index - call.returns]
            onto_itself = [c for c in result.users if _write_back(c) == (base, result)]
            result.replace_all_uses_with(base)
            for copy in onto_itself:  # now copy_(base, base)
                copy.replace_all_uses_with(base)
                gm.graph.erase_node(copy)
        gm.graph.erase_node(result)
    gm.graph.erase_node(node)
    return True


def reinplace_input_mutations(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    config: Any,
) -> None:
    """Fold input write-backs into the ops that compute them (see the module docstring)."""
    torch_internals.require("reinplace")
    facts = _facts(gm)
    if facts is None:
        return
    # max-autotune's segments hold auto_functionalized_v2 calls, and Inductor calls them in
    # place there: a direct call here, which writes, would end a segment at each custom op
    calls = isinstance(config, CompilerConfig) and (
        resolve_mode(config, graph_device(gm).type) != "max-autotune"
    )
    for node in list(gm.graph.nodes) if calls else []:  # custom ops, in order (chains fold)
        if torch_internals.functionalized_call(node) and _fold_into_call(gm, node, facts):
            facts.refresh(gm)  # a call's results regrouped: rare enough to redo the classes
    for copy in list(gm.graph.nodes):  # then each remaining write-back
        if copy not in facts.order:  # erased by an earlier rewrite
            continue
        found = _write_back(copy)
        if found is None:
            continue
        dst, src = found
        if not _fold_into_op(gm, copy, dst, src, facts):
            _reinplace_temporary(gm, src, facts)
