"""Example models and passes shipped with airstream (used by the demo, docs and tests).

Layer: applications. May import: options.
"""
