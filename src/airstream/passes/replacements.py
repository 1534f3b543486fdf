"""Pattern replacements: find a subgraph by example and replace it, as a pass.

Example::

    def search(x, y):
        return torch.add(x, y).relu()

    def replace(x, y):
        return torch.ops.my_lib.add_relu(x, y)

    fusions = airstream.passes.Replacements()
    fusions.register(search, replace, example_inputs=(torch.empty(8, 8), torch.empty(8, 8)))
    config.post_grad_custom_post_pass = fusions

``search`` and ``replace`` are traced into aten graphs (Inductor's pattern matcher does the
tracing and matching); every match in a compiled graph is replaced by ``replace``'s graph. A match
whose nodes lie on either side of an air op (a stream scope's edge, a record or wait) is skipped:
replacing it would move work across streams or events. TorchAir's ``register_replacement`` is a
process-wide instance of this class.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch.fx

from airstream import torch_internals
from airstream.passes.regions import region_index

__all__ = ["Replacements"]


class Replacements:
    """A set of registered pattern replacements, callable as a pass ``fn(gm, example_inputs,
    config)``."""

    def __init__(self, name: str = "airstream_replacements") -> None:
        torch_internals.require("patterns")
        self._patterns = torch_internals.pattern_pass(name)
        self._regions: dict[torch.fx.Graph, dict[torch.fx.Node, int]] = {}
        self._lock = threading.Lock()
        self.count = 0  # patterns registered
        self.__name__ = name

    def register(
        self,
        search_fn: Callable[..., Any],
        replace_fn: Callable[..., Any],
        example_inputs: Iterable[Any],
        trace_fn: Callable[..., Any] | None = None,
        extra_check: Callable[[Any], bool] | None = None,
        search_fn_pattern: Any = None,
        scalar_workaround: dict[str, float | int] | None = None,
        skip_duplicates: bool = False,
    ) -> None:
        """Replace every match of ``search_fn`` by ``replace_fn``.

        ``example_inputs`` trace both (their sizes do not matter); ``trace_fn`` defaults to a
        forward-only trace; ``extra_check(match)`` may veto a match (its argument is Inductor's
        ``Match``: ``match.kwargs`` maps ``search_fn``'s argument names to graph nodes);
        ``scalar_workaround`` names scalar arguments and the values to trace them with;
        ``skip_duplicates`` ignores a pattern registered twice instead of raising.
        """
        for name, fn in (("search_fn", search_fn), ("replace_fn", replace_fn)):
            if not callable(fn):
                raise TypeError(f"{name} must be a function, got {type(fn).__name__}")
        check = extra_check or (lambda match: True)

        def same_region(match: Any) -> bool:
            return self._one_region(match) and bool(check(match))

        with self._lock:
            torch_internals.register_pattern(
                self._patterns,
                search_fn=search_fn,
                replace_fn=replace_fn,
                example_inputs=list(example_inputs),
                trace_fn=trace_fn or torch_internals.trace_forward(),
                extra_check=same_region,
                search_fn_pattern=search_fn_pattern,
                scalar_workaround=scalar_workaround,
                skip_duplicates=skip_duplicates,
            )
            self.count += 1

    def _one_region(self, match: Any) -> bool:
        """Do the matched nodes all lie between the same two air ops?"""
        nodes = [n for n in match.nodes if isinstance(n, torch.fx.Node)]
        if not nodes:
            return True
        graph = nodes[0].graph
        regions = self._regions.get(graph)
        if regions is None:
            return False  # matched outside __call__: no region map, no replacement
        if any(n not in regions for n in nodes):  # nodes an earlier replacement added
            regions = self._regions[graph] = region_index(graph)
        return len({regions[n] for n in nodes}) == 1

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], config: Any
    ) -> None:
        """Apply every registered replacement to ``gm`` (a pass)."""
        if not self.count:
            return
        graph = gm.graph
        self._regions[graph] = region_index(graph)
        try:
            torch_internals.apply_patterns(self._patterns, gm)
        finally:
            del self._regions[graph]

    def __repr__(self) -> str:
        return f"Replacements({self.__name__!r}, {self.count} patterns)"
