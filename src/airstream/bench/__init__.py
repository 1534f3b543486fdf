"""Benchmarks behind ``airstream bench``."""
