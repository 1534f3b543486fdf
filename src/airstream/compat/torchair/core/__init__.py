"""``torchair.core``: only what TorchAir scripts import from it (``core.utils.logger``)."""

from airstream.compat.torchair.core import utils

__all__ = ["utils"]
