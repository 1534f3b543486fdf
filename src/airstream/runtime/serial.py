"""The reference executor: every stream's steps on one thread, in the plan's global order.

``plan.sequence`` follows graph order, which is a valid order for every rule of the stream
semantics (data edges, record/wait, wait_tensor, mutation order, RNG order), so running it
serially is correct by construction; it backs ``debug.run_eagerly`` and is the oracle the
parallel runtimes are tested against. Records and waits generate nothing, ``wait_tensor(a, b)``
is ``a`` (a copy where ``a`` is broadcast or strided, as in eager), so per-op cost is exactly that
of an ``fx.GraphModule``.
"""

from __future__ import annotations

from typing import Any

import torch.fx

from airstream.runtime.codegen import GeneratedCode, Hooks, LazyTraced, generate, inputs_read
from airstream.runtime.trace import CallTrace, tracing_wanted
from airstream.schedule.plan import StreamPlan

__all__ = ["SerialExecutor"]


class SerialExecutor:
    """Boxed callable (AOTAutograd convention: takes the argument list, empties it) running one
    planned graph on the calling thread."""

    def __init__(self, gm: torch.fx.GraphModule, plan: StreamPlan) -> None:
        # An instance attribute, so wrappers made with functools.wraps (AOTAutograd wraps the
        # backward compiler's result) copy it and keep calling us boxed.
        self._boxed_call = True
        self.plan = plan
        self._gm = gm
        self._labels = tuple(s.label for s in plan.streams)
        self._code = self._generate(traced=False)
        self.module = self._code.module
        self._forward = self._code.fn
        self._traced = LazyTraced(lambda: self._generate(traced=True).fn)

    def _generate(self, traced: bool) -> GeneratedCode:
        steps = self.plan.sequence
        inputs = inputs_read(self._gm, steps, returns=True)
        return generate(
            self._gm,
            steps,
            inputs=inputs,
            hooks=Hooks(),
            returns=True,
            traced=traced,
            name="AirstreamSerial",
        )

    @property
    def code(self) -> str:
        """The generated Python code that runs."""
        return self.module.code

    def __call__(self, args: list[Any]) -> Any:
        if not tracing_wanted():
            return self._forward(args)
        traced = self._traced.get()
        trace = CallTrace()  # its clock starts once the traced code exists
        try:
            return traced(args, {label: trace.stream(label) for label in self._labels})
        finally:
            trace.finish()
