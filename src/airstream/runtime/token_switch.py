"""A split graph's calls with too few tokens run the graph unsplit: ``microbatch_overlap``'s
dynamic graph, called with fewer than ``min_tokens`` tokens, would otherwise run micro-batches
of one token (its count is an input of the call, read before it runs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airstream.runtime.codegen import Executor

__all__ = ["TokenCountSwitch"]


class TokenCountSwitch:
    """``split`` for calls whose argument ``index`` (the token count) is at least
    ``min_tokens``, else ``unsplit``."""

    def __init__(self, split: Executor, unsplit: Executor, index: int, min_tokens: int) -> None:
        self._boxed_call = True
        self.split, self.unsplit = split, unsplit
        self.index, self.min_tokens = index, min_tokens

    @property
    def code(self) -> str:
        return self.split.code

    @property
    def candidates(self) -> Mapping[str, Executor]:
        """Both executors, named (for reports)."""
        return {"split": self.split, f"unsplit (< {self.min_tokens} tokens)": self.unsplit}

    def __call__(self, args: list[Any]) -> Any:
        if int(args[self.index]) < self.min_tokens:
            return self.unsplit(args)
        return self.split(args)
