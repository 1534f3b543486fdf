"""airstream's options: ``CompilerConfig`` and its groups (``config.py``), the machinery every
config is declared with (``schema.py``: options, groups, dotted paths, their errors) and the checks
an option's values pass (``checks.py``).

Layer: base. May import: errors, torch_internals.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``airstream.options`` was the machinery's module before it became this folder: its names
    still resolve, with a DeprecationWarning naming :mod:`airstream.options.schema` (once)."""
    import importlib
    import warnings

    schema = importlib.import_module("airstream.options.schema")
    if name.startswith("__") or not hasattr(schema, name):
        raise AttributeError(f"module 'airstream.options' has no attribute {name!r}")
    warnings.warn(
        f"airstream.options.{name} moved to airstream.options.schema.{name}: import it from there",
        DeprecationWarning,
        stacklevel=2,
    )
    value = getattr(schema, name)
    globals()[name] = value  # warned once: `from ... import` looks a name up twice
    return value
