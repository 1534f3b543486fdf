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

from airstream.backend import AirstreamBackend, GraphCompiler
from airstream.backend import get_backend as _get_backend
from airstream.backend import get_compiler as _get_compiler
from airstream.compat.torchair import core, inference, npu_profiler, ops, scope
from airstream.compat.torchair.config import CompilerConfig
from airstream.compat.torchair.install import install, installed_device
from airstream.compat.torchair.logger import logger

__all__ = [
    "CompilerConfig",
    "core",
    "get_compiler",
    "get_npu_backend",
    "inference",
    "install",
    "installed_device",
    "logger",
    "npu_profiler",
    "ops",
    "scope",
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
) -> AirstreamBackend:
    """TorchAir's backend factory: airstream's backend with the config's options."""
    return _get_backend(_air(compiler_config), decompositions=dict(custom_decompositions or {}))


def get_compiler(compiler_config: CompilerConfig | None = None) -> GraphCompiler:
    """TorchAir's AOTAutograd compiler factory."""
    return _get_compiler(_air(compiler_config))
