"""airstream: a torch.compile backend for custom FX passes and multi-stream execution.

config = airstream.CompilerConfig()
config.post_grad_custom_pre_pass = my_pass
opt = torch.compile(model, backend=airstream.get_backend(compiler_config=config))
"""

from airstream import _moved

_moved.install()  # the flat layout's module paths (airstream.config, ...) resolve to the new ones

from airstream.machine import launch as _launch

_launch.prepare()  # `airstream run`: OpenMP's variables, before the imports below load torch

from airstream import ops, passes
from airstream.backend import get_backend, get_compiler, get_npu_backend
from airstream.caching.compile_cache import cache_compile
from airstream.cli.explain import explain
from airstream.debug.profile import profile
from airstream.errors import CacheWarning, ConfigError, PassError, StreamError, TorchSupportError
from airstream.graph.foreign_ops import declare_caller_threads, declare_shared_state
from airstream.ops.stream import stream
from airstream.ops.torch_streams import current_stream
from airstream.options.config import CompilerConfig

__all__ = [
    "CacheWarning",
    "CompilerConfig",
    "ConfigError",
    "PassError",
    "StreamError",
    "TorchSupportError",
    "cache_compile",
    "declare_caller_threads",
    "declare_shared_state",
    "explain",
    "get_backend",
    "get_compiler",
    "get_npu_backend",
    "ops",
    "passes",
    "profile",
    "current_stream",
    "stream",
]

__version__ = "0.1.0"
