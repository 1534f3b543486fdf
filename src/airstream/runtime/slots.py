"""How a CPU call's values reach the streams that read them: each stream picks the inputs it
reads, and a value one stream makes and another reads goes through a slot of its own per
(value, reading stream), emptied by its reader (``runtime/cpu.py``)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from airstream.graph.effect_queries import data_inputs
from airstream.runtime.codegen import Label
from airstream.schedule.plan import StreamPlan

__all__ = ["Handover", "picker", "take"]


def take(slots: list[Any], index: int) -> Any:
    """Read a slot and empty it: the reading stream now holds the only reference."""
    value = slots[index]
    slots[index] = None
    return value


class Handover:
    """Which values cross streams: a slot per (value, reading stream)."""

    def __init__(self, gm: torch.fx.GraphModule, plan: StreamPlan) -> None:
        stream_of = plan.stream_of()
        output = next(iter(gm.graph.find_nodes(op="output")))
        self.slot: dict[tuple[torch.fx.Node, Label], int] = {}
        self.readers: dict[torch.fx.Node, list[Label]] = {}
        for node, producer in stream_of.items():
            readers: dict[Label, None] = {}
            for user in node.users:
                if user is output:
                    readers[None] = None
                elif user in stream_of and node in data_inputs(user):
                    readers[stream_of[user]] = None
            readers.pop(producer, None)
            for reader in readers:
                self.slot[(node, reader)] = len(self.slot)
            if readers:
                self.readers[node] = list(readers)


def picker(indices: Sequence[int]) -> Callable[[list[Any]], list[Any]]:
    """``args -> [args[i] for i in indices]``, in C where it can be."""
    if not indices:
        return lambda args: []
    if len(indices) == 1:
        (index,) = indices
        return lambda args: [args[index]]
    get = operator.itemgetter(*indices)
    return lambda args: list(get(args))
