"""Executors for planned graphs: serial reference, CPU threads per stream, CUDA streams/graphs.

All generate their code with ``runtime/codegen.py`` and follow its ``Executor`` protocol.
"""

from airstream.runtime.codegen import Executor
from airstream.runtime.serial import SerialExecutor

__all__ = ["Executor", "SerialExecutor"]
