"""``torchair.logger`` and ``torchair.core.utils.logger``: the logger TorchAir scripts import.

TorchAir's is one :class:`logging.Logger` named ``"torchair"``: level ERROR by default (DEBUG when
``TORCH_COMPILE_DEBUG=1`` at import), one handler on ``sys.stdout``, propagating to the root
logger (so root-logger capture sees its records), an ``EVENT`` level (35) with ``logger.event``,
and ``logger.warning_once``. This is the same, built without changing the process-wide logger
class. ``TNG_LOG_LEVEL`` sets TorchAir's C++ logger, which does not exist here: it changes
nothing (as for TorchAir's Python logger).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

from airstream.machine.environment import TORCH_COMPILE_DEBUG

__all__ = ["EVENT", "logger"]

EVENT = 35
logging.addLevelName(EVENT, "EVENT")


class _TorchairLogger(logging.Logger):
    """A logger with TorchAir's extras: ``event`` and ``warning_once``."""

    def event(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log ``msg`` at TorchAir's EVENT level (35)."""
        if self.isEnabledFor(EVENT):
            self._log(EVENT, msg, args, **kwargs)

    @functools.lru_cache(None)  # noqa: B019 - one logger per process, never collected
    def warning_once(self, msg: str) -> None:
        """``warning(msg)``, once per distinct message."""
        self.warning(msg)


def _make() -> _TorchairLogger:
    manager = logging.Logger.manager
    existing = manager.loggerDict.get("torchair")
    if isinstance(existing, _TorchairLogger):
        return existing
    made = _TorchairLogger("torchair")
    made.manager = manager
    made.parent = logging.getLogger()
    manager.loggerDict["torchair"] = made
    made.setLevel(logging.DEBUG if TORCH_COMPILE_DEBUG.read() else logging.ERROR)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(
        logging.Formatter(
            f"[%(levelname)s] TORCHAIR({os.getpid()},{os.path.basename(sys.executable)}):"
            "%(asctime)s [%(filename)s:%(lineno)d] %(message)s"
        )
    )
    made.addHandler(handler)
    return made


logger = _make()
