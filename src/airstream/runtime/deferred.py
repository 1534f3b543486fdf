"""An executor built at its first call: what a measured graph's other candidates are
(:mod:`airstream.compiler.measuring`), so a graph's first call waits for one compile, not one per
candidate. Each is built on the call that is not timed (:mod:`airstream.runtime.measured` times
the second call of each pair), under the caller's thread, outside inference mode and without
grad (a compile makes tensors of its own)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from airstream.runtime.codegen import Executor

__all__ = ["DeferredExecutor"]


class DeferredExecutor:
    """``build()``'s executor, built once, at the first call."""

    def __init__(self, build: Callable[[], Executor]) -> None:
        self._build: Callable[[], Executor] | None = build
        # AOTAutograd hands it the argument list, which a candidate empties; an instance
        # attribute, so a functools.wraps around it (a backward's) keeps it (see serial.py)
        self._boxed_call = True
        self._built: Executor | None = None
        self._lock = threading.Lock()

    @property
    def built(self) -> bool:
        """Whether the first call has built it."""
        return self._built is not None

    @property
    def code(self) -> str:
        """The generated code, once built."""
        built = self._built
        return built.code if built is not None else "# compiled at its first call"

    def executor(self) -> Executor:
        """The executor, built now if no call has built it yet."""
        built = self._built
        if built is not None:
            return built
        with self._lock:
            if self._built is None:
                build, self._build = self._build, None
                assert build is not None
                with torch.inference_mode(False), torch.no_grad():
                    self._built = build()
            return self._built

    def __call__(self, args: list[Any]) -> Any:
        return self.executor()(args)
