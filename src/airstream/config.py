"""CompilerConfig: airstream's options, grouped like TorchAir's, validated on assignment.

Every option lives at a dotted path (``"debug.run_eagerly"``); ``torch.compile(...,
backend="airstream", options={...})`` takes the same paths. Unknown names and bad values raise
:class:`~airstream.errors.ConfigError` naming the valid choices; a pass slot given something
that is not callable raises ``TypeError``.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airstream.errors import ConfigError

__all__ = ["CompilerConfig", "PassSlot"]

PassSlot = Callable[..., Any] | tuple[Callable[..., Any], ...] | None


@dataclass(frozen=True)
class _Option:
    default: Any
    check: Callable[[str, Any], Any]
    doc: str


def _choice(*allowed: Any) -> Callable[[str, Any], Any]:
    def check(path: str, value: Any) -> Any:
        # `True == 1` in Python: compare type as well so 1 is not accepted for True.
        if not any(value == a and type(value) is type(a) for a in allowed):
            raise ConfigError(
                f"invalid value {value!r} for option {path!r}; allowed values: "
                + ", ".join(repr(a) for a in allowed)
            )
        return value

    return check


def _boolean(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(
            f"invalid value {value!r} for option {path!r}; allowed values: True, False"
        )
    return value


def _positive_int(path: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"invalid value {value!r} for option {path!r}; allowed values: an int >= 1"
        )
    return value


def _directory(path: str, value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise ConfigError(
            f"invalid value {value!r} for option {path!r}; allowed values: a directory path (str)"
        )
    return os.fspath(value)


def _pass_slot(path: str, value: Any) -> PassSlot:
    """A pass slot holds None, one callable, or a sequence of callables (stored as a tuple)."""
    if value is None or callable(value):
        return value
    if isinstance(value, (list, tuple)):
        for i, fn in enumerate(value):
            if not callable(fn):
                raise TypeError(
                    f"{path}[{i}] must be a callable fn(gm, example_inputs, config), "
                    f"got {type(fn).__name__} {fn!r}"
                )
        return tuple(value)
    raise TypeError(
        f"{path} must be a callable fn(gm, example_inputs, config) or a list of them, "
        f"got {type(value).__name__} {value!r}"
    )


class _Group:
    """A group of options; subclasses declare ``_OPTIONS`` and nested ``_GROUPS``."""

    _OPTIONS: ClassVar[dict[str, _Option]] = {}
    _GROUPS: ClassVar[dict[str, type[_Group]]] = {}
    _PATH: ClassVar[str] = ""

    def __init__(self) -> None:
        for name, opt in self._OPTIONS.items():
            object.__setattr__(self, name, opt.default)
        for name, group in self._GROUPS.items():
            object.__setattr__(self, name, group())

    def _path(self, name: str) -> str:
        return f"{self._PATH}.{name}" if self._PATH else name

    def _valid_names(self) -> list[str]:
        return sorted([*self._OPTIONS, *self._GROUPS])

    def _unknown(self, name: str) -> ConfigError:
        valid = self._valid_names()
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {self._path(close[0])!r}?" if close else ""
        where = f"option group {self._PATH!r}" if self._PATH else "CompilerConfig"
        return ConfigError(
            f"unknown option {self._path(name)!r}.{hint} Valid names in {where}: "
            + ", ".join(valid)
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._GROUPS:
            raise ConfigError(
                f"{self._path(name)!r} is an option group, not an option; set its options "
                f"instead, e.g. config.{self._path(name)}.<option> = value "
                f"(options: {', '.join(getattr(self, name)._valid_names())})"
            )
        opt = self._OPTIONS.get(name)
        if opt is None:
            raise self._unknown(name)
        object.__setattr__(self, name, opt.check(self._path(name), value))

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails, i.e. for unknown names.
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(str(self._unknown(name)))

    def __delattr__(self, name: str) -> None:
        raise ConfigError(f"options cannot be deleted; assign a value to {self._path(name)!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        parts = [f"{name}={getattr(self, name)!r}" for name in [*self._OPTIONS, *self._GROUPS]]
        return f"{type(self).__name__}({', '.join(parts)})"

    def _items(self) -> Iterable[tuple[str, Any]]:
        for name in self._OPTIONS:
            yield self._path(name), getattr(self, name)
        for name in self._GROUPS:
            yield from getattr(self, name)._items()


class GraphDumpConfig(_Group):
    """``debug.graph_dump``: which graph dumps to write and where."""

    _PATH = "debug.graph_dump"
    _OPTIONS = {
        "type": _Option(None, _choice(None, "txt", "py", "dot", "svg"), "dump format, None = off"),
        "path": _Option(".", _directory, "directory the dumps are written to"),
    }


class DebugConfig(_Group):
    """``debug``: dumps, reference execution and pass verification."""

    _PATH = "debug"
    _GROUPS = {"graph_dump": GraphDumpConfig}
    _OPTIONS = {
        "run_eagerly": _Option(
            False, _boolean, "run the optimized graph serially, in graph order (reference)"
        ),
        "verify_passes": _Option(
            False, _boolean, "lint the graph and re-check node metadata after every pass"
        ),
        "strict_max_autotune": _Option(
            False,
            _boolean,
            "max-autotune: a segment Inductor cannot compile is an error (default: it runs as "
            "aten code, logged once)",
        ),
    }


class ExperimentalConfig(_Group):
    """``experimental_config``: switches for the built-in passes and AOTAutograd."""

    _PATH = "experimental_config"
    _OPTIONS = {
        "remove_noop_ops": _Option(
            True, _boolean, "built-in pass: drop view ops that return their input unchanged"
        ),
        "enable_view_optimize": _Option(
            False, _boolean, "built-in pass: rewrite view/_unsafe_view as reshape"
        ),
        "eliminate_dead_code": _Option(True, _boolean, "built-in pass: dead-code elimination"),
        "cse": _Option(True, _boolean, "built-in pass: common-subexpression elimination"),
        "keep_inference_input_mutations": _Option(
            True, _boolean, "keep input mutations (copy_) inside inference graphs"
        ),
        "min_segment_ops": _Option(
            2,
            _positive_int,
            "max-autotune: shortest run of fusible ops compiled by Inductor (shorter runs stay "
            "aten calls: one op alone gains no fusion)",
        ),
    }


class GeConfig(_Group):
    """``ge_config``: TorchAir's graph-engine options that have a meaning off the NPU."""

    _PATH = "ge_config"
    _OPTIONS = {
        "enable_single_stream": _Option(
            False, _boolean, "ignore every stream label and run all nodes on the main stream"
        ),
    }


class StreamConfig(_Group):
    """``stream_config``: how stream workers run."""

    _PATH = "stream_config"
    _OPTIONS = {
        "threads_per_stream": _Option(
            1, _positive_int, "CPU intra-op threads in each stream worker"
        ),
    }


class CompilerConfig(_Group):
    """All of airstream's options.

    Example::

        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = my_pass
        config.debug.run_eagerly = True
        config.set_option("ge_config.enable_single_stream", True)
    """

    _OPTIONS = {
        "mode": _Option(
            "reduce-overhead",
            _choice("reduce-overhead", "max-autotune"),
            "reduce-overhead: generated aten code; max-autotune: Inductor segments per stream",
        ),
        "post_grad_custom_pre_pass": _Option(None, _pass_slot, "pass(es) run before built-ins"),
        "post_grad_custom_post_pass": _Option(None, _pass_slot, "pass(es) run after built-ins"),
    }
    _GROUPS = {
        "debug": DebugConfig,
        "experimental_config": ExperimentalConfig,
        "ge_config": GeConfig,
        "stream_config": StreamConfig,
    }

    @classmethod
    def option_paths(cls) -> list[str]:
        """Every option's dotted path, e.g. ``"debug.graph_dump.type"``."""
        return [path for path, _ in cls()._items()]

    def _resolve(self, path: str) -> tuple[_Group, str]:
        if not isinstance(path, str) or not path:
            raise ConfigError(f"option path must be a non-empty str, got {path!r}")
        *groups, leaf = path.split(".")
        node: _Group = self
        for name in groups:
            if name not in node._GROUPS:
                raise ConfigError(
                    f"unknown option {path!r}; valid options: {', '.join(self.option_paths())}"
                )
            node = getattr(node, name)
        if leaf not in node._OPTIONS:
            close = difflib.get_close_matches(path, self.option_paths(), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown option {path!r}.{hint} Valid options: {', '.join(self.option_paths())}"
            )
        return node, leaf

    def set_option(self, path: str, value: Any) -> None:
        """Set the option at dotted ``path`` (validated as on attribute assignment)."""
        node, leaf = self._resolve(path)
        setattr(node, leaf, value)

    def get_option(self, path: str) -> Any:
        """Read the option at dotted ``path``."""
        node, leaf = self._resolve(path)
        return getattr(node, leaf)

    def as_dict(self) -> dict[str, Any]:
        """All options as ``{dotted path: value}``."""
        return dict(self._items())

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> CompilerConfig:
        """Build a config from ``{dotted path: value}``, as ``torch.compile(options=...)`` gives."""
        config = cls()
        if options is None:
            return config
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"options must be a dict of {{option path: value}}, got {type(options).__name__}"
            )
        for path, value in options.items():
            config.set_option(path, value)
        return config

    def copy(self) -> CompilerConfig:
        """An independent copy with the same values."""
        return CompilerConfig.from_options(self.as_dict())
