"""TorchAir's option objects: a leaf holds one value and checks it; a group holds leaves.

TorchAir scripts read ``config.mode.value`` (a string: ``"1"``/``"0"`` for booleans),
test ``if config.debug.run_eagerly:`` and set ``config.debug.graph_dump.type = "py"``; a bad value
raises with TorchAir's wording, which its tests match on. :class:`Group` routes assignments to
the leaf's checked setter and calls the root's ``_changed(path, leaf)`` hook, which the TorchAir
:class:`~airstream.compat.torchair.config.CompilerConfig` uses to warn about NPU-only options.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from typing import Any

from airstream.errors import ConfigError

__all__ = [
    "Callback",
    "Choice",
    "Dict",
    "Directory",
    "File",
    "Group",
    "IntList",
    "IntRange",
    "JsonFile",
    "Pattern",
    "Text",
    "Value",
]


class Value:
    """One TorchAir option: ``default``, ``optional`` (the allowed values, None = any) and
    ``value``, read back as TorchAir reads it (None, ``"1"``/``"0"`` for booleans, else a str)."""

    def __init__(self, default: Any = None, optional: list[Any] | None = None) -> None:
        self._default = default
        self._optional = optional
        self._value = default

    @property
    def default(self) -> Any:
        return self._default

    @property
    def optional(self) -> list[Any] | None:
        return self._optional

    @property
    def raw(self) -> Any:
        """The value as it was set (not converted to TorchAir's string form)."""
        return self._value

    @property
    def value(self) -> Any:
        v = self._value
        if v is None:
            return None
        if str(v) == "True":
            return "1"
        if str(v) == "False":
            return "0"
        return str(v)

    @value.setter
    def value(self, v: Any) -> None:
        self._check(v)
        self._value = v

    def _check(self, v: Any) -> None:
        allowed = self._optional
        if isinstance(allowed, (list, tuple)) and v not in allowed:
            kind = type(allowed[0]) if allowed else None
            raise ConfigError(
                f"Value {v!r} (type: {type(v)}) not in optional list {allowed!r} (type: {kind})."
            )

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._value!r})"


class Choice(Value):
    """One of ``optional`` (compared with ``in``, as TorchAir does: ``1 in [True, False]``)."""


class IntRange(Value):
    """An int in ``[low, high]``."""

    def __init__(self, default: int | None, low: int, high: int) -> None:
        super().__init__(default)
        self._low, self._high = low, high

    def _check(self, v: Any) -> None:
        if not isinstance(v, int):
            raise ConfigError(f"Please set integer type, but got {type(v)}")
        if not self._low <= v <= self._high:
            raise ConfigError(
                f"Please set value in [{self._low}, {self._high}], {v} is out of range."
            )


class IntList(Value):
    """None (stored as ``[]``) or a list/tuple of ints; ``value`` reads back the list."""

    @property
    def value(self) -> Any:
        return self._value

    @value.setter
    def value(self, v: Any) -> None:
        if v is not None and not isinstance(v, (list, tuple)):
            raise TypeError(f"the set value must be None or list, got {type(v)}")
        v = [] if v is None else v
        if not all(isinstance(x, int) for x in v):
            kinds = [type(x) for x in v]
            raise TypeError(f"the set value must be int list, got list type: {kinds}")
        self._value = v


class _Typed(Value):
    """None or an instance of ``_TYPE``; ``value`` reads back the object itself."""

    _TYPE: type | tuple[type, ...] = object
    _WORD = "object"

    def _ok(self, v: Any) -> bool:
        return isinstance(v, self._TYPE)

    @property
    def value(self) -> Any:
        return self._value

    @value.setter
    def value(self, v: Any) -> None:
        if v is not None and not self._ok(v):
            raise TypeError(f"value must be {self._WORD} or None, got {type(v)}")
        self._value = v


class Text(_Typed):
    """None or a str."""

    _TYPE, _WORD = str, "str"


class Dict(_Typed):
    """None or a dict."""

    _TYPE, _WORD = dict, "dict"


class Callback(_Typed):
    """None or a callable (a custom pass)."""

    _WORD = "Callable"

    def _ok(self, v: Any) -> bool:
        return callable(v)


class File(Value):
    """None or the path of an existing file."""

    @property
    def value(self) -> Any:
        return Value.value.fget(self)  # type: ignore[attr-defined]

    @value.setter
    def value(self, v: Any) -> None:
        if v is not None and not os.path.isfile(v):
            raise FileNotFoundError(
                f"Please set legal file path, {v} is not found or is not a file!"
            )
        self._value = v


class JsonFile(Value):
    """None or the path of an existing ``.json`` file."""

    @property
    def value(self) -> Any:
        return Value.value.fget(self)  # type: ignore[attr-defined]

    @value.setter
    def value(self, v: Any) -> None:
        if v is not None:
            if v == "":
                raise ConfigError("File path cannot be empty!")
            if not (os.path.isfile(v) and str(v).endswith(".json")):
                raise FileNotFoundError(
                    f"Please set legal file path, {v} is not found or is not '.json' file!"
                )
        self._value = v


class Directory(Value):
    """The path of an existing directory (None is rejected)."""

    @property
    def value(self) -> Any:
        return Value.value.fget(self)  # type: ignore[attr-defined]

    @value.setter
    def value(self, v: Any) -> None:
        if v is None or not os.path.isdir(v):
            raise FileNotFoundError(
                f"Please set legal dir path, {v} is not found or is not a file directory!"
            )
        self._value = v


class Pattern(Value):
    """A str matching ``regex``."""

    def __init__(self, default: str, regex: str, example: str) -> None:
        super().__init__(default)
        self._regex, self._example = regex, example

    def _check(self, v: Any) -> None:
        if not isinstance(v, str) or not re.match(self._regex, v):
            raise ConfigError(
                f"Please set legal regex value format match {self._regex}, {v} is Illegal "
                f"format, correct example:{self._example}."
            )


class Group:
    """Options set in ``__init__`` (leaves, subgroups or plain attributes), then fixed: assigning
    an unknown name raises, assigning a leaf runs its check. ``_prefix``: its dotted path."""

    _fixed: tuple[str, ...]
    _prefix: str
    _root: Group
    _OPEN = False  # True: any new name is accepted as a plain attribute

    def __init__(self, path: str = "") -> None:
        object.__setattr__(self, "_prefix", path)
        object.__setattr__(self, "_root", self)
        names = tuple(k for k in vars(self) if not k.startswith("_") or k in self._private())
        object.__setattr__(self, "_fixed", names)
        for name in names:
            child = vars(self)[name]
            if isinstance(child, Group):
                object.__setattr__(child, "_prefix", self._join(name))
                child._adopt(self._root)

    @staticmethod
    def _private() -> tuple[str, ...]:
        return ()

    def _adopt(self, root: Group) -> None:
        object.__setattr__(self, "_root", root)
        for name in self._fixed:
            child = vars(self)[name]
            if isinstance(child, Group):
                object.__setattr__(child, "_prefix", self._join(name))
                child._adopt(root)

    def _join(self, name: str) -> str:
        return f"{self._prefix}.{name}" if self._prefix else name

    def _unknown(self, name: str) -> ConfigError:
        close = difflib.get_close_matches(name, self._fixed, n=1)
        hint = f" Did you mean {self._join(close[0])!r}?" if close else ""
        return ConfigError(
            f"{type(self).__name__} has no option {name}, all options {list(self._fixed)} "
            f"(TorchAir option {self._join(name)!r}).{hint}"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if "_fixed" not in vars(self):  # still in __init__
            object.__setattr__(self, name, value)
            return
        prop = getattr(type(self), name, None)
        if isinstance(prop, property) and prop.fset is not None:
            prop.fset(self, value)
            self._root._changed(self._join(name), value)
            return
        if name not in self._fixed:
            if not self._OPEN:
                raise self._unknown(name)
            object.__setattr__(self, "_fixed", (*self._fixed, name))
            vars(self)[name] = None
        current = vars(self)[name]
        if isinstance(current, Group):
            raise ConfigError(
                f"TorchAir option {self._join(name)!r} is a group; set its options instead, "
                f"e.g. config.{self._join(name)}.{current._fixed[0]} = ..."
            )
        if isinstance(current, Value):
            current.value = value
        else:
            object.__setattr__(self, name, value)
        self._root._changed(self._join(name), value)

    def _changed(self, path: str, value: Any) -> None:
        """Called on the root after an option at ``path`` was set (and passed its check)."""

    def leaves(self) -> Iterator[tuple[str, Any]]:
        """``(dotted path, leaf or plain value)`` for every option under this group."""
        for name in self._fixed:
            child = vars(self)[name]
            if isinstance(child, Group):
                yield from child.leaves()
            else:
                yield self._join(name), child

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        mine = {p: (v.raw if isinstance(v, Value) else v) for p, v in self.leaves()}
        theirs = {p: (v.raw if isinstance(v, Value) else v) for p, v in other.leaves()}
        return mine == theirs

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._prefix or 'root'})"
