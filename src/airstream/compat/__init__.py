"""Compatibility surfaces for code written against other stacks (``airstream.compat.torchair``)."""
