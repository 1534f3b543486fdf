"""``torch_npu.profiler`` off the NPU: torch's own profiler, with NPU activity read as CUDA
(when there is a GPU) or dropped (CPU), and the NPU-only settings accepted and ignored.

TorchAir's guides profile a compiled model with it to see the streams; here the trace is
torch's (open it in Perfetto / chrome://tracing), and ``airstream.profile()`` gives the
per-stream timeline.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

import torch
import torch.profiler as _tp

__all__ = [
    "ProfilerActivity",
    "ProfilerLevel",
    "profile",
    "schedule",
    "tensorboard_trace_handler",
]

schedule = _tp.schedule
tensorboard_trace_handler = _tp.tensorboard_trace_handler


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


class ProfilerLevel(enum.Enum):
    Level_none = "Level_none"
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"


class AiCMetrics(enum.Enum):
    PipeUtilization = "PipeUtilization"
    ArithmeticUtilization = "ArithmeticUtilization"
    Memory = "Memory"


class _ExperimentalConfig:
    """NPU profiling settings (levels, AI-core metrics): accepted, no effect here."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings


def _activities(wanted: Iterable[Any] | None) -> list[Any] | None:
    if wanted is None:
        return None
    mapped = []
    for activity in wanted:
        name = getattr(activity, "name", str(activity))
        if name == "CPU":
            mapped.append(_tp.ProfilerActivity.CPU)
        elif name in ("NPU", "CUDA") and torch.cuda.is_available():
            mapped.append(_tp.ProfilerActivity.CUDA)
    return mapped or [_tp.ProfilerActivity.CPU]


class profile(_tp.profile):
    """``torch.profiler.profile`` with NPU activity mapped to the device here. ``step()`` after
    the ``with`` block has ended does nothing, as on the NPU (torch's own profiler crashes the
    process at exit in that case, with ``with_stack=True``, on torch 2.13 and 2.15)."""

    def __init__(
        self,
        activities: Iterable[Any] | None = None,
        *,
        experimental_config: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(activities=_activities(activities), **kwargs)
        self._open = False

    def __enter__(self) -> profile:
        self._open = True
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._open = False

    def step(self) -> None:
        if self._open:
            super().step()
