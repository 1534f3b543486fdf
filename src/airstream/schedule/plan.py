"""StreamPlan: per stream, the ordered steps a runtime executes (run node, record, wait).

The planner walks the graph in order. Each stream runs its nodes in graph order; every
requirement that crosses streams (data, control, mutation, RNG; see ``deps.py``) becomes a wait
on the consumer's stream for an event recorded right after the producer on its stream. The final
join makes the main stream wait for the last step of every side stream.

Fewest waits: each stream keeps a vector clock (for every stream, the last position known to be
complete). A requirement already covered by the clock, directly or through an earlier wait's
clock, is dropped. The plan keeps each run's clock (``StreamPlan.known``): which runs of other
streams may overlap it is read from there (``overlap.py``). No deadlock: every wait names an
event recorded after a node that is earlier in graph order, and every stream follows graph order,
so the graph order itself is a valid schedule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch.fx

from airstream.graph.effect_queries import is_executed
from airstream.graph.streams import StreamAssignment
from airstream.ops.library import record, wait
from airstream.schedule.deps import Requirement, requirements

__all__ = [
    "Record",
    "Run",
    "StreamPlan",
    "StreamSteps",
    "Sync",
    "Wait",
    "build_plan",
    "planned_syncs",
]

Label = str | None


@dataclass(frozen=True)
class Run:
    """Execute FX node ``node``."""

    node: torch.fx.Node

    def __str__(self) -> str:
        return f"run {self.node.name}"


@dataclass(frozen=True)
class Record:
    """Mark event ``event`` as reached (everything before it on this stream is done)."""

    event: int

    def __str__(self) -> str:
        return f"record e{self.event}"


@dataclass(frozen=True)
class Wait:
    """Block this stream until event ``event`` is reached."""

    event: int

    def __str__(self) -> str:
        return f"wait e{self.event}"


Step = Run | Record | Wait


@dataclass(frozen=True)
class Sync:
    """One cross-stream wait in the plan and why it is there.

    ``reason`` is ``data``, ``mutation``, ``rng``, ``collective`` or ``join`` for syncs the
    planner added, and
    ``control`` for the user's ``wait``/``wait_tensor`` edges. ``consumer`` is the graph's
    output node for the final join.
    """

    event: int
    producer: torch.fx.Node
    producer_stream: Label
    consumer: torch.fx.Node
    consumer_stream: Label
    reason: str

    @property
    def automatic(self) -> bool:
        """True if the planner added this sync (it is not a user's control edge)."""
        return self.reason != "control"


@dataclass(frozen=True)
class StreamSteps:
    """One stream's program."""

    label: Label
    steps: tuple[Step, ...]

    @property
    def runs(self) -> tuple[torch.fx.Node, ...]:
        """The nodes this stream executes, in order."""
        return tuple(s.node for s in self.steps if isinstance(s, Run))

    @property
    def run_names(self) -> tuple[str, ...]:
        """Names of the nodes this stream executes, in order."""
        return tuple(s.node.name for s in self.steps if isinstance(s, Run))


def _name(label: Label) -> str:
    return "main" if label is None else label


@dataclass(frozen=True)
class StreamPlan:
    """Frozen plan: the main stream first, then side streams in order of first use."""

    streams: tuple[StreamSteps, ...]
    syncs: tuple[Sync, ...]
    dropped_waits: int
    priorities: Mapping[str, int] = field(default_factory=dict)
    # Every step of every stream in one order that respects each stream's order and puts each
    # record before its waits (graph order): what a single-threaded issuer (CUDA) follows.
    sequence: tuple[tuple[Label, Step], ...] = ()
    # Per run: its vector clock, for each stream the index among that stream's runs of the last
    # one known complete when this run starts (its own stream: itself), through every wait
    # before it; the happens-before the planner works out, read by schedule/overlap.py.
    known: Mapping[torch.fx.Node, Mapping[Label, int]] = field(default_factory=dict)

    def stream(self, label: Label) -> StreamSteps:
        """The program of stream ``label``."""
        for s in self.streams:
            if s.label == label:
                return s
        raise KeyError(f"no stream {label!r} in this plan")

    @property
    def side_streams(self) -> tuple[StreamSteps, ...]:
        """All streams but main."""
        return tuple(s for s in self.streams if s.label is not None)

    @property
    def num_events(self) -> int:
        """How many events a call of this plan records."""
        return len({s.event for s in self.syncs})

    def stream_of(self) -> dict[torch.fx.Node, Label]:
        """The stream each executed node runs on."""
        return {node: s.label for s in self.streams for node in s.runs}

    def summary(self) -> str:
        """Stream allocation summary: per stream ops/records/waits, then the syncs added."""
        lines = [f"{'stream':<16}{'ops':>6}{'records':>9}{'waits':>7}"]
        for s in self.streams:
            ops = sum(isinstance(x, Run) for x in s.steps)
            recs = sum(isinstance(x, Record) for x in s.steps)
            waits = sum(isinstance(x, Wait) for x in s.steps)
            lines.append(f"{_name(s.label):<16}{ops:>6}{recs:>9}{waits:>7}")
        auto = [s for s in self.syncs if s.automatic]
        lines.append(
            f"syncs: {len(auto)} added by the planner, {len(self.syncs) - len(auto)} from "
            f"record/wait/wait_tensor, {self.dropped_waits} implied by earlier waits and dropped"
        )
        for sync in self.syncs:
            lines.append(
                f"  e{sync.event}: {sync.producer.name} [{_name(sync.producer_stream)}] -> "
                f"{sync.consumer.name} [{_name(sync.consumer_stream)}]  ({sync.reason})"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = []
        for s in self.streams:
            parts.append(f"stream {_name(s.label)}:")
            parts += [f"  {step}" for step in s.steps]
        return "\n".join(parts)


class _Planner:
    def __init__(self, graph: torch.fx.Graph, assignment: StreamAssignment) -> None:
        self.assignment = assignment
        self.graph = graph
        self.runs: dict[Label, list[torch.fx.Node]] = {label: [] for label in assignment.streams}
        self.pending: dict[Label, list[Step]] = {label: [] for label in assignment.streams}
        self.clock: dict[Label, dict[Label, int]] = {label: {} for label in assignment.streams}
        self.snapshots: dict[tuple[Label, int], dict[Label, int]] = {}
        self.position: dict[torch.fx.Node, tuple[Label, int]] = {}
        self.events: dict[tuple[Label, int], int] = {}
        self.syncs: list[Sync] = []
        self.dropped = 0
        self.log: list[tuple[Label, Step]] = []  # every step as emitted, in graph order

    def _resolve(self, req: Requirement) -> tuple[Label, int] | None:
        """The stream position a requirement points at, or None if it needs nothing."""
        before = req.before
        if before in self.position:
            return self.position[before]
        return None  # placeholders, constants, and tokens recorded before any work

    def _sync(
        self, stream: Label, consumer: torch.fx.Node, target: tuple[Label, int], reason: str
    ) -> None:
        source, index = target
        if source == stream:
            return
        if self.clock[stream].get(source, -1) >= index:
            self.dropped += 1
            return
        event = self.events.setdefault(target, len(self.events))
        self.pending[stream].append(Wait(event))
        self.log.append((stream, Wait(event)))
        producer = self.runs[source][index]
        self.syncs.append(Sync(event, producer, source, consumer, stream, reason))
        for label, pos in self.snapshots[target].items():
            if self.clock[stream].get(label, -1) < pos:
                self.clock[stream][label] = pos

    def _needs(self, stream: Label, consumer: torch.fx.Node, reqs: list[Requirement]) -> None:
        targets = []
        for req in reqs:
            target = self._resolve(req)
            if target is not None:
                targets.append((target, req.reason))
        # Latest positions first: waiting on them often implies the earlier ones.
        targets.sort(key=lambda t: -t[0][1])
        for target, reason in targets:
            self._sync(stream, consumer, target, reason)

    def plan(self) -> StreamPlan:
        self.walk(requirements(self.graph))
        return self._freeze()

    def walk(self, reqs: Mapping[torch.fx.Node, list[Requirement]]) -> None:
        """Place every node and the waits it needs, in graph order."""
        stream_of = self.assignment.stream_of
        last_run: dict[Label, int] = {}
        for node in self.graph.nodes:
            if node.op == "output":
                self._join(node)
                continue
            if node.op != "call_function":
                continue
            stream = stream_of[node.name]
            if node.target is record and not is_executed(node):
                if stream in last_run:  # the token stands for the stream's last run so far
                    self.position[node] = (stream, last_run[stream])
                continue
            if node.target is wait:
                self._needs(stream, node, reqs[node])
                continue
            if not is_executed(node):
                continue
            self._needs(stream, node, reqs[node])
            index = len(self.runs[stream])
            self.runs[stream].append(node)
            self.pending[stream].append(Run(node))
            self.log.append((stream, Run(node)))
            self.clock[stream][stream] = index
            self.snapshots[(stream, index)] = dict(self.clock[stream])
            self.position[node] = (stream, index)
            last_run[stream] = index

    def _join(self, output: torch.fx.Node) -> None:
        data = [Requirement(n, "data") for n in output.all_input_nodes]
        self._needs(None, output, data)
        for label, runs in self.runs.items():
            if label is not None and runs:
                self._sync(None, output, (label, len(runs) - 1), "join")

    def _freeze(self) -> StreamPlan:
        runs_seen: dict[Label, int] = {label: -1 for label in self.assignment.streams}
        sequence: list[tuple[Label, Step]] = []
        for label, step in self.log:
            sequence.append((label, step))
            if isinstance(step, Run):
                runs_seen[label] += 1
                event = self.events.get((label, runs_seen[label]))
                if event is not None:
                    sequence.append((label, Record(event)))
        streams = tuple(
            StreamSteps(label, tuple(step for owner, step in sequence if owner == label))
            for label in self.assignment.streams
        )
        known = {self.runs[label][index]: clock for (label, index), clock in self.snapshots.items()}
        return StreamPlan(
            streams=streams,
            syncs=tuple(self.syncs),
            dropped_waits=self.dropped,
            priorities=dict(self.assignment.priorities),
            sequence=tuple(sequence),
            known=known,
        )


def build_plan(gm: torch.fx.GraphModule, assignment: StreamAssignment) -> StreamPlan:
    """Plan ``gm`` (an optimized graph) on the streams of ``assignment``."""
    return _Planner(gm.graph, assignment).plan()


def planned_syncs(
    gm: torch.fx.GraphModule,
    assignment: StreamAssignment,
    reqs: Mapping[torch.fx.Node, list[Requirement]] | None = None,
) -> tuple[Sync, ...]:
    """The syncs :func:`build_plan` adds for ``assignment``, without the streams' programs (what
    a placement costs). ``reqs``: ``requirements(gm.graph)``, when already worked out (they do not
    depend on the streams)."""
    planner = _Planner(gm.graph, assignment)
    planner.walk(requirements(gm.graph) if reqs is None else reqs)
    return tuple(planner.syncs)
