"""Independent checks of a StreamPlan: it terminates, and it honours every requirement."""

from __future__ import annotations

import torch.fx

from airstream.graph.streams import StreamAssignment
from airstream.ops.library import record, wait
from airstream.schedule.deps import requirements
from airstream.schedule.plan import Record, Run, StreamPlan, Wait


def simulate(plan: StreamPlan) -> None:
    """Run the plan's steps with every stream advancing when it can; fail on a deadlock."""
    pointer = {s.label: 0 for s in plan.streams}
    recorded: set[int] = set()
    while True:
        progressed = False
        for s in plan.streams:
            while pointer[s.label] < len(s.steps):
                step = s.steps[pointer[s.label]]
                if isinstance(step, Wait) and step.event not in recorded:
                    break
                if isinstance(step, Record):
                    recorded.add(step.event)
                pointer[s.label] += 1
                progressed = True
        if all(pointer[s.label] == len(s.steps) for s in plan.streams):
            return
        if not progressed:
            stuck = {
                s.label: s.steps[pointer[s.label]]
                for s in plan.streams
                if pointer[s.label] < len(s.steps)
            }
            raise AssertionError(f"plan deadlocks; blocked at {stuck}")


def check_requirements(
    gm: torch.fx.GraphModule, plan: StreamPlan, streams: StreamAssignment
) -> None:
    """Every cross-stream requirement of every node is ordered by the plan's events.

    A ``wait`` node's requirements must hold for the first node its stream runs after it; a
    requirement on a record token means the last node run on the token's stream before it.
    """
    where: dict[str, tuple[object, int]] = {}
    clock_at: dict[str, dict[object, int]] = {}
    event_clock: dict[int, dict[object, int]] = {}
    # Streams only wait on events recorded earlier in graph order, so processing streams in a
    # simulated order gives every Wait its Record's clock.
    pointer = {s.label: 0 for s in plan.streams}
    clocks: dict[object, dict[object, int]] = {s.label: {} for s in plan.streams}
    runs = {s.label: 0 for s in plan.streams}
    while any(pointer[s.label] < len(s.steps) for s in plan.streams):
        for s in plan.streams:
            while pointer[s.label] < len(s.steps):
                step = s.steps[pointer[s.label]]
                clock = clocks[s.label]
                if isinstance(step, Wait):
                    if step.event not in event_clock:
                        break
                    for k, v in event_clock[step.event].items():
                        clock[k] = max(clock.get(k, -1), v)
                elif isinstance(step, Record):
                    event_clock[step.event] = dict(clock)
                elif isinstance(step, Run):
                    clock[s.label] = runs[s.label]
                    where[step.node.name] = (s.label, runs[s.label])
                    clock_at[step.node.name] = dict(clock)
                    runs[s.label] += 1
                pointer[s.label] += 1
    # Resolve record tokens and find, for each wait node, the next node run on its stream.
    position: dict[str, tuple[object, int]] = dict(where)
    last_run: dict[object, int] = {}
    pending_waits: dict[object, list[torch.fx.Node]] = {}
    checked_as: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.name in where:
            label, idx = where[node.name]
            last_run[label] = idx
            for w in pending_waits.pop(label, []):
                checked_as[w.name] = node.name
        elif node.op == "call_function" and node.target is record:
            label = streams.stream(node)
            if label in last_run:
                position[node.name] = (label, last_run[label])
        elif node.op == "call_function" and node.target is wait:
            pending_waits.setdefault(streams.stream(node), []).append(node)
    for node, reqs in requirements(gm.graph).items():
        subject = checked_as.get(node.name, node.name)
        if subject not in where:
            continue  # a wait with nothing after it on its stream: the join covers it
        label, _ = where[subject]
        for req in reqs:
            if req.before.name not in position:
                continue
            src, idx = position[req.before.name]
            if src == label:
                assert idx <= where[subject][1], (req, node)
                continue
            got = clock_at[subject].get(src, -1)
            assert got >= idx, (
                f"{node.name} on {label!r} may start before {req.before.name} on {src!r} "
                f"({req.reason})"
            )
