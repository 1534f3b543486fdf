"""Stream analysis (and, later, the StreamPlan) built from an optimized graph."""

from airstream.schedule.streams import StreamAssignment, assign_streams

__all__ = ["StreamAssignment", "assign_streams"]
