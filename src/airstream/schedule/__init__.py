"""The stream planner: ordering requirements, the plan, max-autotune fusion, and the lowering of
PyTorch's stream IR. Stream analysis itself (``assign_streams``) is in
:mod:`airstream.graph.streams`.

Layer: schedule (its planner, ``deps``, ``plan`` and ``overlap``, is the layer below the passes,
which ask it what a placement costs). May import: errors, torch_internals, machine, ops, graph.
"""
