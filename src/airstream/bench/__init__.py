"""Benchmarks behind ``airstream bench``.

Layer: applications. May import: torch_internals, options, machine, ops, graph, passes, schedule,
runtime, debug, backend, caching, compat, selftest, airstream.
"""
