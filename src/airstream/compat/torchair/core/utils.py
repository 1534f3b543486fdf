"""``torchair.core.utils``: the ``logger`` TorchAir's tests and docs import from here."""

from airstream.compat.torchair.logger import logger

__all__ = ["logger"]
