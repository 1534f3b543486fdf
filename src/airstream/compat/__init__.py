"""Compatibility surfaces for code written against other stacks (``airstream.compat.torchair``).

Layer: applications. May import: errors, torch_internals, options, machine, ops, passes, runtime,
compiler, backend, caching.
"""
