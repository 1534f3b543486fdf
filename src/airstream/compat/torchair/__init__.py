"""``airstream.compat.torchair``: the TorchAir user surface for streams, off the NPU.

    import airstream.compat.torchair as torchair
    config = torchair.CompilerConfig()
    opt = torch.compile(model, backend=torchair.get_npu_backend(compiler_config=config))
    with torchair.scope.npu_stream_switch("s1"):
        ...

``install()`` (or ``airstream run --torchair script.py``) makes ``import torchair`` resolve here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from airstream.backend import GraphCompiler
from airstream.backend import get_compiler as _get_compiler
from airstream.compat.torchair import cache, core, inference, npu_profiler, ops, scope
from airstream.compat.torchair.backend import TorchairBackend
from airstream.compat.torchair.config import CompilerConfig
from airstream.compat.torchair.install import install, installed_device
from airstream.compat.torchair.logger import logger
from airstream.compat.torchair.patterns import register_replacement

__all__ = [
    "CompilerConfig",
    "core",
    "get_compiler",
    "get_npu_backend",
    "cache",
    "inference",
    "install",
    "installed_device",
    "logger",
    "npu_profiler",
    "ops",
    "patch_for_hcom",
    "register_replacement",
    "scope",
    "use_internal_format_weight",
]


def _air(config: CompilerConfig | None) -> Any:
    if config is None:
        return CompilerConfig().airstream
    if not isinstance(config, CompilerConfig):
        raise TypeError(
            "compiler_config must be a torchair CompilerConfig "
            f"(airstream.compat.torchair.CompilerConfig), got {type(config).__name__}"
        )
    return config.airstream


def get_npu_backend(
    compiler_config: CompilerConfig | None = None,
    custom_decompositions: Mapping[Any, Callable[..., Any]] | None = None,
) -> TorchairBackend:
    """TorchAir's backend factory: airstream's backend with the config's options (and
    ``torch.compile(..., options={...})`` in TorchAir's option names)."""
    _air(compiler_config)  # checks the type
    config = compiler_config if compiler_config is not None else CompilerConfig()
    return TorchairBackend(config, dict(custom_decompositions or {}))


def get_compiler(compiler_config: CompilerConfig | None = None) -> GraphCompiler:
    """TorchAir's AOTAutograd compiler factory."""
    return _get_compiler(_air(compiler_config))


def patch_for_hcom() -> None:
    """TorchAir's collective patches for old torch: nothing to patch on torch >= 2.3.1 (as
    TorchAir itself says); airstream handles collectives in graphs on its own."""
    logger.warning(
        "For versions 2.3.1 and above of PyTorch, there is no need to call patch_for_hcom anymore."
    )


def use_internal_format_weight(model: torch.nn.Module) -> None:
    """Cast weights to the NPU's internal layouts: there are none off the NPU, so the model is
    left as it is."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"use_internal_format_weight expects a torch.nn.Module, got {model!r}")
