"""airstream's stream passes for Inductor users: ``for_inductor(pass)`` is torch's
``CustomGraphPass`` running an airstream pass on Inductor's post-grad graph and writing its
streams in PyTorch's own stream IR, which Inductor's user-stream code generation runs::

    import airstream, torch
    from airstream.inductor import for_inductor

    auto = for_inductor(airstream.passes.auto_streams())
    compiled = torch.compile(model, options={"post_grad_custom_post_pass": auto})

torch itself assigns no streams automatically (pytorch#189521); with this, a plain ``torch.compile``
on CUDA gets airstream's shared-expert, projection and list-schedule placement as CUDA streams of
Inductor's own generated code. The pass writes one ``torch.Stream`` per side stream (Dynamo's graph
bytecode builds it before each call), annotates each node with it, and makes every ordering
airstream's planner would make an explicit event pair (``airstream.schedule.torch_streams_out``).
``uuid()`` names the pass and its settings, so Inductor's FX graph cache keeps graphs compiled with
different passes apart. Inductor's CPU code cannot run streams (its wrapper fails with ``NameError:
name 'default_stream' is not defined``), so a graph on the CPU is handed on unchanged, with one
warning (use airstream's backend there); ``on_cpu=True`` writes it anyway, to look at what Inductor
would get.
"""

from __future__ import annotations

import hashlib
import inspect
import warnings
from collections.abc import Callable, Sequence
from dataclasses import is_dataclass
from typing import Any

import torch
import torch.fx

import airstream
from airstream import torch_internals
from airstream.graph.devices import graph_device
from airstream.passes.manager import pass_name
from airstream.schedule.torch_streams import uses_torch_streams
from airstream.schedule.torch_streams_out import TorchStreamsWritten, write_torch_streams

__all__ = ["for_inductor"]

GraphPass = Callable[[torch.fx.GraphModule, Sequence[Any], Any], None]


def _settings(graph_pass: GraphPass) -> str:
    """The pass's name and the values it was made with (a factory's arguments: plain values and
    dataclasses, such as auto_streams' MachineCosts, by their repr)."""
    cells = []
    for cell in getattr(graph_pass, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        if isinstance(value, (int, float, str, bool, type(None))) or is_dataclass(value):
            cells.append(repr(value))
    return f"{pass_name(graph_pass)}({', '.join(cells)})"


def _backward(gm: torch.fx.GraphModule) -> bool:
    return any(n.name.startswith("tangents") for n in gm.graph.find_nodes(op="placeholder"))


def for_inductor(graph_pass: GraphPass, *, on_cpu: bool = False) -> Any:
    """``graph_pass`` (an airstream pass: ``fn(gm, example_inputs, config)``) as an Inductor
    post-grad custom pass writing PyTorch's stream IR; see the module docstring. ``on_cpu``:
    also rewrite graphs on the CPU (which Inductor then cannot run)."""
    torch_internals.require("inductor-pass")
    base, hash_files = torch_internals.custom_graph_pass()
    if not callable(graph_pass):
        raise TypeError(f"for_inductor: expected an airstream pass, got {graph_pass!r}")
    settings = _settings(graph_pass)
    source = inspect.getsourcefile(graph_pass) if inspect.isfunction(graph_pass) else None

    class AirstreamStreams(base):  # type: ignore[misc, valid-type]
        """An airstream stream pass on Inductor's post-grad graph, written in native form."""

        def __init__(self) -> None:
            self.graph_pass = graph_pass
            self.written: list[TorchStreamsWritten] = []  # per graph: what it wrote

        def __call__(self, graph: torch.fx.Graph) -> None:
            gm = graph.owning_module
            if not isinstance(gm, torch.fx.GraphModule):
                raise TypeError("for_inductor: the graph has no GraphModule (not Inductor's?)")
            why = self._declined(gm)
            if why is not None:
                warnings.warn(f"airstream: for_inductor({settings}) {why}", stacklevel=2)
                return
            self.graph_pass(gm, [], None)
            self.written.append(write_torch_streams(gm))

        def _declined(self, gm: torch.fx.GraphModule) -> str | None:
            """Why this graph is handed on as it is, or None."""
            if graph_device(gm).type == "cpu" and not on_cpu:
                return (
                    "leaves a CPU graph as it is: Inductor's CPU code cannot run streams. "
                    "Compile with airstream's backend (torch.compile(model, "
                    "backend=airstream.get_backend(config))) to run the pass on CPU streams."
                )
            if _backward(gm):
                return (
                    "leaves a backward graph as it is: Inductor compiles it at the first "
                    "backward, after Dynamo's bytecode is made, so the stream objects it would "
                    "need could not be built for the calls. Forward graphs get their streams."
                )
            if uses_torch_streams(gm):
                return (
                    "leaves a graph with the model's own torch.Stream blocks or events as it "
                    "is: its streams are the model's."
                )
            return None

        def uuid(self) -> Any:
            files = hash_files((source,)) if source else b""
            text = f"airstream {airstream.__version__} {settings}".encode()
            return hashlib.sha256(text + (files if isinstance(files, bytes) else b"")).hexdigest()

        def __repr__(self) -> str:
            return f"for_inductor({settings})"

    return AirstreamStreams()
