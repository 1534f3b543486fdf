"""One CPU stream's generated code: its steps as a function (``runtime/codegen.py``) with the CPU
runtime's hooks, plain and (on first need) traced, and the inputs it reads.

Every stream's function takes ``(inputs, slots, events, call)``: the graph inputs it reads, the
call's value slots (``runtime/slots.py``), its events and the call itself (``runtime/call.py``).
A record sets the event's flag, a wait waits for it (``runtime/events.py``); a side stream whose
main stream's op count switches (``runtime/threads.py``) marks itself idle around each wait.

A side stream whose last step is a record leaves that record out of its plain code:
``final_event`` names it, and the thread that ran the stream sets it once it has let go of the
GIL (``runtime/workers.py``), so that the caller waiting at the join takes the GIL at once.
"""

from __future__ import annotations

import operator

import torch.fx

from airstream.runtime import events as ev
from airstream.runtime.codegen import (
    Builder,
    GeneratedCode,
    Hooks,
    Label,
    LazyTraced,
    generate,
    inputs_read,
)
from airstream.runtime.slots import Handover, picker, take
from airstream.runtime.threads import Switching, idle, wake, working
from airstream.schedule.plan import Record, StreamSteps

__all__ = ["StreamCode"]


class _StreamHooks(Hooks):
    params = ("slots", "events", "call")

    def __init__(
        self, handover: Handover, switching: Switching | None = None, side: int | None = None
    ) -> None:
        self.handover = handover
        self.switching = switching  # None: every stream keeps threads_per_stream for the call
        self.side = side  # a side stream's index in the call's ``working`` flags
        self._alone = False  # the call starts the main stream on its shared threads

    def before_op(self, b: Builder, label: Label, node: torch.fx.Node) -> None:
        switching = self.switching
        alone = switching.plan.get(node) if switching is not None and label is None else None
        if switching is None or alone is None:
            return  # an op whose threads do not matter runs on whatever count is set
        if alone:
            if not self._alone:  # once per run of such ops
                b.call(switching.threads.alone, b.params["call"])
                self._alone = True
        else:
            b.call(switching.threads.now, b.params["call"])
            self._alone = False

    def record(self, b: Builder, label: Label, event: int) -> None:
        trace = b.trace(label)
        events = b.params["events"]
        woken = self.switching.waiters.get(event) if self.switching is not None else None
        if woken:
            b.call(wake, b.params["call"], woken)
        if trace is None:
            b.call(ev.record, events, event)
        else:
            b.call(ev.record_traced, events, event, trace)

    def wait(self, b: Builder, label: Label, event: int) -> None:
        trace = b.trace(label)
        events, call = b.params["events"], b.params["call"]
        counted = self.switching is not None and self.side is not None
        if counted:  # the main stream may take every thread while this one waits
            b.call(idle, call, self.side)
        if trace is None:
            b.call(ev.wait, events, event, call)
        else:
            b.call(ev.wait_traced, events, event, call, trace)
        if counted:
            b.call(working, call, self.side)

    def fetch(self, b: Builder, node: torch.fx.Node, label: Label) -> torch.fx.Node:
        return b.call(take, b.params["slots"], self.handover.slot[(node, label)])

    def produced(self, b: Builder, node: torch.fx.Node, label: Label, value: torch.fx.Node) -> None:
        for reader in self.handover.readers.get(node, ()):
            slot = self.handover.slot[(node, reader)]
            b.call(operator.setitem, b.params["slots"], slot, value)


class StreamCode:
    """One stream's generated code (``code``; ``traced`` on first need), the inputs it reads
    (``pick(args)``) and, for a side stream ending with a record, that record's event
    (``final_event``, left to the stream's thread)."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        program: StreamSteps,
        handover: Handover,
        main: bool,
        switching: Switching | None = None,
        side: int | None = None,
    ) -> None:
        self.label = program.label
        steps = [(program.label, step) for step in program.steps]
        reads = inputs_read(gm, steps, returns=main)
        self.pick = picker(list(reads.values()))
        own = {n: i for i, n in enumerate(reads)}
        name = f"AirstreamStream_{'main' if main else program.label}"  # generate() sanitizes
        last = program.steps[-1] if program.steps else None
        self.final_event = last.event if not main and isinstance(last, Record) else None
        plain = steps[:-1] if self.final_event is not None else steps

        def build(traced: bool) -> GeneratedCode:
            return generate(
                gm,
                steps if traced else plain,
                inputs=own,
                hooks=_StreamHooks(handover, switching, side),
                returns=main,
                traced=traced,
                name=name,
                label=program.label,
            )

        self.code = build(traced=False)
        self.traced = LazyTraced(lambda: build(traced=True))
