"""The ``air`` ops, their Python wrappers, and the ``airstream.stream`` context manager.

Layer: base. May import: torch_internals.
"""

from airstream.ops import air_print, library, tagged
from airstream.ops.stream import stream
from airstream.ops.wrappers import record, wait, wait_tensor

__all__ = ["air_print", "library", "record", "stream", "tagged", "wait", "wait_tensor"]
