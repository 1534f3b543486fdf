"""The option machinery behind every config: declared options, checks, groups, dotted paths.

:class:`Option` declares one option (default, check, doc, optional effect; the checks are in
:mod:`airstream.options.checks`); :class:`OptionGroup`
validates on assignment, nests groups, resolves dotted paths, and explains unknown names and bad
values (:class:`~airstream.errors.ConfigError`, with "did you mean"). airstream's
:class:`~airstream.options.config.CompilerConfig` is built on it, and the table of environment
variables (:mod:`airstream.machine.environment`) checks with its checks. (The TorchAir config
follows TorchAir's own object model, leaves with ``.value``, in
:mod:`airstream.compat.torchair.values`.)
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from airstream.errors import ConfigError
from airstream.options.checks import Check, Invalid, anything

__all__ = ["Effect", "Option", "OptionGroup"]

Effect = Callable[["OptionGroup", str, Any], None]
"""``effect(root, path, value)`` runs after the check, before the value is stored; may raise."""


@dataclass(frozen=True)
class Option:
    """One option: its default, the check its values pass and what setting it does."""

    default: Any = None
    check: Check = anything
    doc: str = ""
    effect: Effect | None = None


def _tree(
    table: Mapping[str, Option], prefix: str
) -> tuple[dict[str, Option], dict[str, type[OptionGroup]], Option | None]:
    """Options, generated subgroup classes and the ``*`` option of the group at ``prefix``."""
    options: dict[str, Option] = {}
    subtables: dict[str, dict[str, Option]] = {}
    wildcard = None
    for path, opt in table.items():
        head, dot, rest = path.partition(".")
        if dot:
            subtables.setdefault(head, {})[rest] = opt
        elif head == "*":
            wildcard = opt
        else:
            options[head] = opt
    if clash := sorted(options.keys() & subtables.keys()):
        raise TypeError(f"{clash} under {prefix or 'the root'!r}: both option and group")
    groups: dict[str, type[OptionGroup]] = {}
    for name, sub in subtables.items():
        path = f"{prefix}.{name}" if prefix else name
        opts, subgroups, wild = _tree(sub, path)
        attrs = {"_PATH": path, "_OPTIONS": opts, "_GROUPS": subgroups, "_OPEN": wild}
        groups[name] = type(path, (OptionGroup,), attrs)
    return options, groups, wildcard


class OptionGroup:
    """Options and nested groups at ``_PATH``, checked on assignment, with dotted-path access.

    Declare ``_OPTIONS`` and ``_GROUPS``, or subclass with ``table={dotted path: Option}``; a path
    ending in ``*`` makes its group take any other name as that option. The root's ``_NOUN`` and
    ``_ALLOWED`` word the errors.
    """

    _OPTIONS: ClassVar[dict[str, Option]] = {}
    _GROUPS: ClassVar[dict[str, type[OptionGroup]]] = {}
    _OPEN: ClassVar[Option | None] = None
    _PATH: ClassVar[str] = ""
    _NOUN: ClassVar[str] = "option"
    _ALLOWED: ClassVar[str] = "allowed values"
    _root: OptionGroup
    _values: dict[str, Any]

    def __init_subclass__(cls, table: Mapping[str, Option] | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if table is not None:
            cls._OPTIONS, cls._GROUPS, cls._OPEN = _tree(table, cls._PATH)
        if shadowed := [name for name in (*cls._OPTIONS, *cls._GROUPS) if hasattr(cls, name)]:
            raise TypeError(f"{cls.__name__}: option names {shadowed} shadow attributes")

    def __init__(self) -> None:
        self._setup(self)

    def _setup(self, root: OptionGroup) -> None:
        values: dict[str, Any] = {name: opt.default for name, opt in self._OPTIONS.items()}
        for name, group in self._GROUPS.items():
            values[name] = sub = group.__new__(group)
            sub._setup(root)
        object.__setattr__(self, "_root", root)
        object.__setattr__(self, "_values", values)

    @classmethod
    def _path(cls, name: str) -> str:
        return f"{cls._PATH}.{name}" if cls._PATH else name

    def _valid_names(self) -> list[str]:
        return sorted([*self._OPTIONS, *self._GROUPS, *(["*"] if self._OPEN else [])])

    def _option(self, name: str) -> Option | None:
        if name in self._OPTIONS:
            return self._OPTIONS[name]
        if name in self._GROUPS or name.startswith("_") or not name.isidentifier():
            return None
        return self._OPEN

    def _unknown(self, name: str) -> ConfigError:
        valid = self._valid_names()
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {self._path(close[0])!r}?" if close else ""
        where = f"option group {self._PATH!r}" if self._PATH else type(self).__name__
        return ConfigError(
            f"unknown {self._root._NOUN} {self._path(name)!r}.{hint} Valid names in {where}: "
            + ", ".join(valid)
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._GROUPS:
            raise ConfigError(
                f"{self._path(name)!r} is an option group, not an option; set its options "
                f"instead, e.g. config.{self._path(name)}.<option> = value "
                f"(options: {', '.join(self._values[name]._valid_names())})"
            )
        opt = self._option(name)
        if opt is None:
            raise self._unknown(name)
        path = self._path(name)
        try:
            checked = opt.check(path, value)
        except Invalid as e:
            raise ConfigError(
                f"invalid value {value!r} for {self._root._NOUN} {path!r}; "
                f"{self._root._ALLOWED}: {e}"
            ) from None
        if opt.effect is not None:
            opt.effect(self._root, path, checked)
        self._values[name] = checked

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: option values, or unknown names.
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._values:
            return self._values[name]
        opt = self._option(name)
        if opt is None:
            raise AttributeError(str(self._unknown(name)))
        return opt.default

    def __delattr__(self, name: str) -> None:
        raise ConfigError(f"options cannot be deleted; assign a value to {self._path(name)!r}")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._values == other._values

    __hash__ = None  # type: ignore[assignment]  # mutable, compared by value

    def __repr__(self) -> str:
        parts = [f"{name}={value!r}" for name, value in self._values.items()]
        return f"{type(self).__name__}({', '.join(parts)})"

    def _items(self) -> Iterator[tuple[str, Any]]:
        groups = []
        for name, value in self._values.items():
            if isinstance(value, OptionGroup):
                groups.append(value)
            else:
                yield self._path(name), value
        for group in groups:
            yield from group._items()

    @classmethod
    def _declared(cls) -> Iterator[str]:
        yield from (cls._path(name) for name in cls._OPTIONS)
        if cls._OPEN is not None:
            yield cls._path("*")
        for group in cls._GROUPS.values():
            yield from group._declared()

    @classmethod
    def option_paths(cls) -> list[str]:
        """Every declared option's dotted path, e.g. ``"debug.graph_dump.type"``."""
        return [path for path in cls._declared() if not path.endswith("*")]

    def _resolve(self, path: str) -> tuple[OptionGroup, str]:
        if not isinstance(path, str) or not path:
            raise ConfigError(f"option path must be a non-empty str, got {path!r}")
        *groups, leaf = path.split(".")
        node: OptionGroup | None = self
        for name in groups:
            node = node._values[name] if node is not None and name in node._GROUPS else None
        if node is None or node._option(leaf) is None:
            valid = list(self._declared())
            close = difflib.get_close_matches(self._path(path), valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown {self._root._NOUN} {self._path(path)!r}.{hint} "
                f"Valid options: {', '.join(valid)}"
            )
        return node, leaf

    def set_option(self, path: str, value: Any) -> None:
        """Set the option at dotted ``path`` (checked as on attribute assignment)."""
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
    def from_options(cls, options: Mapping[str, Any] | None) -> Self:
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
