"""Executors for optimized graphs (serial reference today; thread-per-stream and CUDA later)."""

from airstream.runtime.serial import SerialExecutor, strip_air_ops

__all__ = ["SerialExecutor", "strip_air_ops"]
