"""One plan-to-code generator for every executor.

An executor runs a :class:`~airstream.schedule.plan.StreamPlan` as FX-generated Python functions:
the serial executor one function over ``plan.sequence``, the CUDA executor one function that
issues every stream's steps, the CPU runtime one function per stream. :func:`generate` turns a
list of ``(stream, step)`` into such a function; what a record, a wait, a stream switch or a value
crossing streams means is the executor's, given as :class:`Hooks`.

Every generated function has the same shape::

    def forward(self, inputs, <the hooks' parameters>, [traces]):
        x = inputs[0]; w = inputs[1]; inputs.clear()   # the boxed convention: the caller's
                                                        # list lets go of every input
        mm = aten.mm(x, w);  x = None                   # FX frees each value after its last use
        ...

so an input or an intermediate dies as soon as its last reader on that function has run; values
that cross streams are the hooks' to hand over and let go of. ``wait_tensor(x, dep)`` is ``x``
(only its ordering mattered), or a copy of ``x`` as eager makes one where ``x`` is broadcast or
strided (its value, which its readers were compiled for, is laid out as a fresh tensor); a
record token nobody reads as data is not made. The traced variant (``traced=True``) brackets
every op with the profiler's hooks; executors build it the first time a profiler listens
(:class:`Executor`).
"""

from __future__ import annotations

import functools
import operator
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch.fx

from airstream import torch_internals
from airstream.graph.effect_queries import data_inputs
from airstream.graph.layouts import same_layout_as
from airstream.graph.nodes import describe, segment_of
from airstream.ops.library import record, wait_tensor
from airstream.ops.torch_streams import NATIVE_OPS
from airstream.runtime.trace import op_begin, op_end
from airstream.schedule.plan import Record, Run, Step, Wait

__all__ = [
    "Builder",
    "Executor",
    "GeneratedCode",
    "Hooks",
    "LazyTraced",
    "Label",
    "emit_op",
    "generate",
    "inputs_read",
]

Label = str | None


@runtime_checkable
class Executor(Protocol):
    """What the backend hands to AOTAutograd: a boxed callable (``_boxed_call``: it takes the
    argument list and empties it) with the generated ``code`` it runs."""

    _boxed_call: bool

    @property
    def code(self) -> str: ...

    def __call__(self, args: list[Any]) -> Any: ...


_COPY = torch.ops.aten.clone.default


def emit_op(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    arg: Callable[[torch.fx.Node], torch.fx.Node],
    trace: torch.fx.Node | None,
    target: Any = None,
    args: tuple[torch.fx.Node, ...] = (),
) -> torch.fx.Node:
    """Copy ``node`` into ``graph`` (inputs mapped by ``arg``), bracketed by tracing calls when
    ``trace`` (the StreamTrace of the node's stream) is given; with ``target``, a call of it on
    ``args`` stands for ``node``."""

    def make() -> torch.fx.Node:
        if target is None:
            return graph.node_copy(node, arg)
        return graph.call_function(target, tuple(arg(a) for a in args))

    if trace is None:
        return make()
    token = graph.call_function(op_begin, (trace, node.name))
    new = make()
    segment = segment_of(node)
    if segment is None:
        graph.call_function(op_end, (trace, node.name, token))
    else:  # max-autotune: the profile says what the segment fused and which kernels ran
        details = (segment.describe(), segment.segment.nodes)
        graph.call_function(op_end, (trace, node.name, token, *details))
    return new


class Builder:
    """The function being generated, as the hooks see it."""

    def __init__(
        self,
        graph: torch.fx.Graph,
        params: Mapping[str, torch.fx.Node],
        trace: Callable[[Label], torch.fx.Node | None],
    ) -> None:
        self.graph = graph
        self.params = params  # the hooks' parameters, by name
        self.trace = trace  # the StreamTrace of a stream in traced code, else None

    def call(self, fn: Callable[..., Any], *args: Any) -> torch.fx.Node:
        """Emit ``fn(*args)``."""
        return self.graph.call_function(fn, args)


class Hooks:
    """What an executor does at each point of its generated code; every hook is optional."""

    params: tuple[str, ...] = ()  # extra parameters of the generated function, after ``inputs``

    def begin(self, b: Builder) -> None:
        """Before the first step."""

    def end(self, b: Builder) -> None:
        """After the last step, before the return."""

    def switch(self, b: Builder, label: Label) -> None:
        """The steps that follow run on stream ``label``."""

    def before_op(self, b: Builder, label: Label, node: torch.fx.Node) -> None:
        """``node``'s op is about to be issued on ``label``."""

    def record(self, b: Builder, label: Label, event: int) -> None:
        """``label`` reached event ``event``."""

    def wait(self, b: Builder, label: Label, event: int) -> None:
        """``label`` waits for event ``event``."""

    def fetch(self, b: Builder, node: torch.fx.Node, label: Label) -> torch.fx.Node:
        """The value of ``node``, computed by another function (stream), read on ``label``."""
        raise AssertionError(f"{node.name} is read on {label!r} but computed elsewhere")

    def first_use(
        self, b: Builder, node: torch.fx.Node, label: Label, value: torch.fx.Node
    ) -> None:
        """``label`` is about to use ``node``'s value for the first time."""

    def produced(self, b: Builder, node: torch.fx.Node, label: Label, value: torch.fx.Node) -> None:
        """``node`` ran on ``label`` and its value is ``value``."""

    def native(
        self,
        b: Builder,
        label: Label,
        node: torch.fx.Node,
        read: Callable[[torch.fx.Node], torch.fx.Node],
    ) -> torch.fx.Node | None:
        """Issue ``node``, an ``air.native_*`` step on the user's own CUDA streams and events,
        on ``label``; None (the default): run its op, which does nothing."""
        return None


@dataclass(frozen=True)
class GeneratedCode:
    """A generated function: its module, the callable, and the nodes (for error locations)."""

    label: Label
    module: torch.fx.GraphModule
    fn: Callable[..., Any]
    nodes: tuple[torch.fx.Node, ...]
    sources: Mapping[torch.fx.Node, torch.fx.Node]  # generated node -> the graph node it runs

    def failed_node(self, error: BaseException) -> torch.fx.Node | None:
        """The graph node whose op raised ``error`` in this function, if one did."""
        filename = self.module.forward.__code__.co_filename
        tb = error.__traceback__
        node = None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == filename:
                index = torch_internals.generated_node_index(self.module, tb.tb_lineno)
                if index is not None and index < len(self.nodes):
                    node = self.sources.get(self.nodes[index], node)
            tb = tb.tb_next
        return node

    def locate(self, error: BaseException, stream_of: Mapping[torch.fx.Node, Label] = {}) -> str:
        """Name the node of this function that raised ``error``, and its stream (this
        function's, or the node's in ``stream_of`` for a function issuing several)."""
        node = self.failed_node(error)
        label = stream_of.get(node, self.label) if node is not None else self.label
        stream = "the main stream" if label is None else f"stream {label!r}"
        if node is None:
            return stream
        return f"{describe(node)}, on {stream}"


def _clear(inputs: list[Any]) -> None:
    inputs.clear()


def _ident(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _passes_through(node: torch.fx.Node) -> bool:
    """Whether ``wait_tensor(x, dep)`` can be ``x`` itself: where its value has ``x``'s layout.
    Its value is laid out as a fresh tensor like ``x`` (its eager kernel clones), which a
    broadcast or strided ``x`` is not; what reads it was compiled for that layout, so there the
    op runs as eager runs it, a copy."""
    (waited,) = data_inputs(node)
    mine, theirs = node.meta.get("val"), waited.meta.get("val")
    if not isinstance(mine, torch.Tensor) or not isinstance(theirs, torch.Tensor):
        return True
    return same_layout_as(mine, theirs)


def _reads_token(node: torch.fx.Node) -> bool:
    """A record token some node reads as data (not only as ordering)."""
    return any(node in data_inputs(user) for user in node.users)


class _Writer:
    """The function :func:`generate` is writing: its graph, the value of each node on each
    stream so far, and the hooks that say what crossing streams means."""

    def __init__(self, inputs: Mapping[torch.fx.Node, int], hooks: Hooks, traced: bool) -> None:
        self.graph = graph = torch.fx.Graph()
        self.hooks = hooks
        inputs_param = graph.placeholder("inputs")
        params = {p: graph.placeholder(p) for p in hooks.params}
        self.traces = graph.placeholder("traces") if traced else None
        self.env: dict[torch.fx.Node, torch.fx.Node] = {}
        self.sources: dict[torch.fx.Node, torch.fx.Node] = {}  # generated -> the node it runs
        self.used: set[tuple[torch.fx.Node, Label]] = set()
        self.trace_of: dict[Label, torch.fx.Node] = {}
        self.current: Label | int = -1  # the stream selected last (none yet)
        # Unpack every input this function reads, then let go of the caller's list.
        for node, index in sorted(inputs.items(), key=lambda item: item[1]):
            self.env[node] = graph.call_function(operator.getitem, (inputs_param, index))
        graph.call_function(_clear, (inputs_param,))
        self.b = Builder(graph, params, self.trace_for)

    def value(self, node: torch.fx.Node, on: Label) -> torch.fx.Node:
        """``node``'s value on stream ``on`` (fetched from another stream on first need)."""
        env = self.env
        if node not in env:
            if node.op == "get_attr":
                env[node] = self.graph.get_attr(str(node.target))
            else:
                env[node] = self.hooks.fetch(self.b, node, on)
        if (node, on) not in self.used and node.op != "get_attr":
            self.used.add((node, on))
            self.hooks.first_use(self.b, node, on, env[node])
        return env[node]

    def trace_for(self, on: Label) -> torch.fx.Node | None:
        """The StreamTrace of ``on`` in traced code, else None."""
        if self.traces is None:
            return None
        if on not in self.trace_of:
            self.trace_of[on] = self.graph.call_function(operator.getitem, (self.traces, on))
        return self.trace_of[on]

    def run(self, on: Label, node: torch.fx.Node) -> None:
        """Issue ``node`` on stream ``on``."""
        hooks, b = self.hooks, self.b
        read = functools.partial(_read, self, on)
        if node.target is wait_tensor and _passes_through(node):
            (waited,) = data_inputs(node)
            self.env[node] = read(waited)  # identity: only the ordering mattered
        elif node.target is record and not _reads_token(node):
            return  # an event position: nothing to compute
        elif node.target in NATIVE_OPS and (issued := hooks.native(b, on, node, read)) is not None:
            self.env[node] = issued
        else:
            if self.current != on:  # switch streams only to issue an op
                hooks.switch(b, on)
                self.current = on
            hooks.before_op(b, on, node)
            if node.target is wait_tensor:  # a copy in the layout its readers expect
                (waited,) = data_inputs(node)
                new = emit_op(self.graph, node, read, self.trace_for(on), _COPY, (waited,))
            else:
                new = emit_op(self.graph, node, read, self.trace_for(on))
            self.sources[new] = node
            self.env[node] = new
        hooks.produced(b, node, on, self.env[node])


def _read(writer: _Writer, on: Label, node: torch.fx.Node) -> torch.fx.Node:
    return writer.value(node, on)


def generate(
    gm: torch.fx.GraphModule,
    steps: Sequence[tuple[Label, Step]],
    *,
    inputs: Mapping[torch.fx.Node, int],
    hooks: Hooks,
    returns: bool,
    traced: bool = False,
    name: str = "Airstream",
    label: Label = None,
) -> GeneratedCode:
    """Generate the function running ``steps`` of ``gm``.

    ``inputs`` maps each placeholder this function reads to its index in the ``inputs`` list the
    function takes (and empties). ``returns``: the function returns the graph's outputs, else
    None. ``traced``: take a last parameter ``traces`` (stream label -> StreamTrace) and bracket
    every op. ``label`` names the stream in error locations (one-stream functions).
    """
    writer = _Writer(inputs, hooks, traced)
    hooks.begin(writer.b)
    for on, step in steps:
        if isinstance(step, Run):
            writer.run(on, step.node)
        elif isinstance(step, Record):
            hooks.record(writer.b, on, step.event)
        elif isinstance(step, Wait):
            hooks.wait(writer.b, on, step.event)
    hooks.end(writer.b)
    graph = writer.graph
    if returns:
        output = next(iter(gm.graph.find_nodes(op="output")))
        graph.output(torch.fx.map_arg(output.args[0], lambda n: writer.value(n, None)))
    else:
        graph.output(None)
    suffix = "Traced" if traced else ""
    module = torch.fx.GraphModule(gm, graph, class_name=f"{_ident(name)}{suffix}")
    return GeneratedCode(label, module, module.forward, tuple(module.graph.nodes), writer.sources)


def inputs_read(
    gm: torch.fx.GraphModule, steps: Sequence[tuple[Label, Step]], returns: bool
) -> dict[torch.fx.Node, int]:
    """The placeholders ``steps`` (and, with ``returns``, the graph's outputs) read, in graph
    order, each with its position in the graph's argument list."""
    read: set[torch.fx.Node] = set()
    for _, step in steps:
        if isinstance(step, Run):
            read.update(data_inputs(step.node))
    if returns:
        output = next(iter(gm.graph.find_nodes(op="output")))
        read.update(output.all_input_nodes)
    placeholders = gm.graph.find_nodes(op="placeholder")
    return {n: i for i, n in enumerate(placeholders) if n in read}


class LazyTraced:
    """The traced variant of an executor's code, generated the first time a profiler listens."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self._build = build
        self._value: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The traced code (built on first call; thread-safe)."""
        value = self._value
        if value is None:
            with self._lock:
                if self._value is None:
                    self._value = self._build()
                value = self._value
        return value

    @property
    def built(self) -> bool:
        """Whether the traced code exists yet."""
        return self._value is not None
