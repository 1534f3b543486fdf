"""Facts about an FX graph that every stage after tracing asks, each decided in one place: what
an op does beyond its result (``effects.py``) and what other libraries' ops need
(``foreign_ops.py``), each node's stream and the checks a stream program passes (``streams.py``),
small node helpers (``nodes.py``), layouts (``layouts.py``), what a max-autotune segment may hold
and became (``fusion.py``, ``fused.py``), the device and mode a graph compiles for
(``devices.py``, ``mode.py``), and copies of a lowered graph placed anew (``placements.py``).

Layer: base. May import: errors, torch_internals, options, machine, ops.
"""
