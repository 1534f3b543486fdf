"""Self-tests behind ``airstream selftest``: the stream-program fuzzer and the OpInfo sweep.

Layer: applications. May import: errors, torch_internals, options, ops, graph, passes, schedule,
runtime, backend, airstream.
"""
