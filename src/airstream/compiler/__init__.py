"""One graph's compile once Dynamo has traced it, as :mod:`airstream.backend` runs it:
AOTAutograd's decompositions (``decompositions.py``), the passes (``pipeline.py``), the placement
alone or its candidates measured (``measuring.py``), the rest down to the executor
(``finish.py``), what a compile keeps for the next process (``graph_cache.py``,
``cached_graph.py``, ``cache_key.py``, ``decisions.py``), and the traceback a compile error shows
(``tracebacks.py``).

Layer: backend. May import: errors, torch_internals, options, machine, ops, graph, passes,
schedule, runtime, debug.
"""
