"""``airstream.cache_compile``: a function compiled once and kept on disk, loaded by the next
process instead of compiled (``compile_cache.py``), and its entries' files with the listing and
clearing behind ``airstream cache`` (``cache_files.py``). The caches a compile itself reads live
in :mod:`airstream.compiler`.

Layer: applications. May import: errors, torch_internals, options, machine, compiler, backend.
"""
