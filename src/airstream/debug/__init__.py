"""Read-only observers of compiled graphs: text reports now; dumps and profiles later."""

from airstream.debug.report import control_edges, format_streams

__all__ = ["control_edges", "format_streams"]
