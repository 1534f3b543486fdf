"""The stream planner: ordering requirements, the plan, max-autotune fusion, and the lowering of
PyTorch's stream IR. Stream analysis itself (``assign_streams``) is in :mod:`airstream.streams`."""
