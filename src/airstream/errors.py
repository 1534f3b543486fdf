"""Error types raised by airstream.

Every error says what happened, where (pass, node, source line, option) and what to do.
"""

from __future__ import annotations

__all__ = [
    "AirstreamError",
    "CacheWarning",
    "ConfigError",
    "PassError",
    "StreamError",
    "TorchSupportError",
]


class AirstreamError(Exception):
    """Base class of the errors airstream raises on purpose."""


class ConfigError(AirstreamError, ValueError):
    """An unknown option name or a value outside an option's allowed values."""


class PassError(AirstreamError):
    """A graph pass raised, or left the graph invalid.

    Attributes:
        pass_name: qualified name of the failing pass.
        stage: the pipeline stage it ran in (``post_grad_custom_pre_pass``, ``builtin``,
            ``post_grad_custom_post_pass``).
        graph_kind: ``inference``, ``forward`` or ``backward``.
    """

    def __init__(self, message: str, *, pass_name: str, stage: str, graph_kind: str) -> None:
        super().__init__(message)
        self.pass_name = pass_name
        self.stage = stage
        self.graph_kind = graph_kind


class StreamError(AirstreamError, RuntimeError):
    """The stream program in a graph is invalid (unpaired scopes, bad waits, deadlock)."""


class TorchSupportError(AirstreamError, RuntimeError):
    """This torch lacks (or changed) a private API airstream needs.

    Attributes:
        feature: the feature's name(s) in ``airstream.torch_internals.FEATURES``.
    """

    def __init__(self, message: str, *, feature: str) -> None:
        super().__init__(message)
        self.feature = feature


class CacheWarning(UserWarning):
    """A compile-cache entry was not used, or a compile could not be saved
    (:mod:`airstream.caching.compile_cache`): each says why and what happens instead."""
