"""Read-only observers of compiled graphs: the compile events the backend publishes and who may
subscribe (``observers.py``), text reports (``report.py``), graph dumps (``dump.py``, ``dot.py``)
and the per-stream timeline profiler (``profile.py``, ``timeline_svg.py``).

Layer: observers. May import: errors, torch_internals, machine, ops, graph, passes, schedule,
runtime.
"""

from airstream.debug.report import control_edges, format_streams

__all__ = ["control_edges", "format_streams"]
