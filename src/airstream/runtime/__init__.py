"""Executors for planned graphs: serial reference, CPU threads per stream, CUDA streams/graphs.

All generate their code with ``runtime/codegen.py`` and follow its ``Executor`` protocol.

Layer: runtime. May import: errors, torch_internals, options, machine, ops, graph, schedule.
"""

from airstream.runtime.codegen import Executor
from airstream.runtime.serial import SerialExecutor

__all__ = ["Executor", "SerialExecutor"]
