"""``torchair.register_replacement``: TorchAir's FX fusion rules, on airstream's Replacements.

TorchAir keeps one process-wide set of patterns and applies it after the custom post pass when
``experimental_config.pattern_fusion_pass`` is on (the default); so does this module (the TorchAir
config adds :data:`replacements` to the post-pass slot of the airstream config it makes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from airstream.passes.replacements import Replacements

__all__ = ["register_replacement", "registered"]

_lock = threading.Lock()
_replacements: Replacements | None = None


def registered() -> Replacements | None:
    """The process-wide replacements, once a pattern is registered (None before)."""
    return _replacements


def register_replacement(
    search_fn: Callable[..., Any],
    replace_fn: Callable[..., Any],
    example_inputs: Iterable[Any],
    trace_fn: Callable[..., Any] | None = None,
    extra_check: Callable[[Any], bool] | None = None,
    search_fn_pattern: Any = None,
    scalar_workaround: dict[str, float | int] | None = None,
    skip_duplicates: bool = False,
) -> None:
    """Register a fusion rule: every match of ``search_fn`` in a compiled graph is replaced by
    ``replace_fn`` (see :meth:`airstream.passes.Replacements.register`); a match that spans
    streams is not replaced, as in TorchAir."""
    global _replacements
    with _lock:
        if _replacements is None:
            _replacements = Replacements("torchair_generic_pattern_pass")
        replacements = _replacements
    replacements.register(
        search_fn,
        replace_fn,
        example_inputs,
        trace_fn=trace_fn,
        extra_check=extra_check,
        search_fn_pattern=search_fn_pattern,
        scalar_workaround=scalar_workaround,
        skip_duplicates=skip_duplicates,
    )


def forget_all() -> None:
    """Drop every registered rule (for tests: TorchAir's set lives as long as the process)."""
    global _replacements
    with _lock:
        _replacements = None
