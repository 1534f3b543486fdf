"""The ``air`` ops, their Python wrappers, and the ``airstream.stream`` context manager."""

from airstream.ops import library
from airstream.ops.stream import stream
from airstream.ops.wrappers import record, wait, wait_tensor

__all__ = ["library", "record", "stream", "wait", "wait_tensor"]
