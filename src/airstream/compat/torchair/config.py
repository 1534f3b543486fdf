"""TorchAir's ``CompilerConfig`` names on top of airstream's.

Options that mean something here are forwarded to an airstream ``CompilerConfig``; options that
only make sense on an NPU are accepted with one warning each that says so; a value outside an
option's allowed set is rejected with ``ValueError`` listing the allowed values, as TorchAir does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from airstream.config import CompilerConfig as AirConfig

__all__ = ["CompilerConfig"]

_ANY = object()  # no fixed set of values


@dataclass(frozen=True)
class _Opt:
    default: Any
    allowed: Any  # a tuple of values, _ANY, or a callable check
    target: str | None  # the airstream option path it sets, or None: no effect off the NPU
    convert: Callable[[Any], Any] | None = None


_warned: set[str] = set()


def _no_effect(path: str) -> None:
    if path not in _warned:
        _warned.add(path)
        warnings.warn(
            f"airstream.compat.torchair: option {path!r} has no effect off the NPU; accepted "
            "and ignored",
            stacklevel=4,
        )


class _Group:
    _OPTIONS: ClassVar[dict[str, _Opt]] = {}
    _GROUPS: ClassVar[dict[str, type[_Group]]] = {}
    _PATH: ClassVar[str] = ""

    def __init__(self, air: AirConfig) -> None:
        object.__setattr__(self, "_air", air)
        object.__setattr__(self, "_values", {k: o.default for k, o in self._OPTIONS.items()})
        for name, group in self._GROUPS.items():
            object.__setattr__(self, name, group(air))

    def _path(self, name: str) -> str:
        return f"{self._PATH}.{name}" if self._PATH else name

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(
            f"{type(self).__name__} has no option {name!r}; options: "
            + ", ".join(sorted([*self._OPTIONS, *self._GROUPS]))
        )

    def __setattr__(self, name: str, value: Any) -> None:
        opt = self._OPTIONS.get(name)
        if opt is None:
            raise ValueError(
                f"unknown TorchAir option {self._path(name)!r}; options here: "
                + ", ".join(sorted([*self._OPTIONS, *self._GROUPS]))
            )
        allowed = opt.allowed
        ok = (
            allowed is _ANY
            or (callable(allowed) and allowed(value))
            or (isinstance(allowed, tuple) and value in allowed)
        )
        if not ok:
            shown = list(allowed) if isinstance(allowed, tuple) else "see the TorchAir docs"
            raise ValueError(
                f"invalid value {value!r} for TorchAir option {self._path(name)!r}; "
                f"optional values: {shown}"
            )
        self._values[name] = value
        if opt.target is None:
            _no_effect(self._path(name))
        else:
            self._air.set_option(opt.target, opt.convert(value) if opt.convert else value)


def _bool() -> tuple[bool, bool]:
    return (True, False)


class _GraphDump(_Group):
    _PATH = "debug.graph_dump"
    _OPTIONS: ClassVar[dict[str, _Opt]] = {
        # TorchAir's pbtxt is GE's graph format: here it is written as txt.
        "type": _Opt(
            None,
            (None, "txt", "pbtxt", "py"),
            "debug.graph_dump.type",
            lambda v: "txt" if v == "pbtxt" else v,
        ),
        "path": _Opt(".", _ANY, "debug.graph_dump.path"),
    }


class _Debug(_Group):
    _PATH = "debug"
    _GROUPS: ClassVar[dict[str, type[_Group]]] = {"graph_dump": _GraphDump}
    _OPTIONS: ClassVar[dict[str, _Opt]] = {
        "run_eagerly": _Opt(False, _bool(), "debug.run_eagerly"),
        "fx_summary": _Opt(None, _ANY, None),
        "data_dump": _Opt(None, _ANY, None),
    }


class _Experimental(_Group):
    _PATH = "experimental_config"
    _OPTIONS: ClassVar[dict[str, _Opt]] = {
        "keep_inference_input_mutations": _Opt(
            True, _bool(), "experimental_config.keep_inference_input_mutations"
        ),
        "remove_noop_ops": _Opt(True, _bool(), "experimental_config.remove_noop_ops"),
        "enable_view_optimize": _Opt(True, _bool(), "experimental_config.enable_view_optimize"),
        "cc_parallel_enable": _Opt(False, _bool(), None),
        "memory_efficiency": _Opt(False, _bool(), None),
        "frozen_parameter": _Opt(False, _bool(), None),
        "static_model_ops_lower_limit": _Opt(
            None, lambda v: v is None or (isinstance(v, int) and -1 <= v), None
        ),
        "jit_compile": _Opt("auto", ("auto",), None),
        "npu_fx_pass": _Opt(False, _bool(), None),
        "tiling_schedule_optimize": _Opt(False, _bool(), None),
        "topology_sorting_strategy": _Opt("DFS", ("BFS", "DFS", "RDFS", "StableRDFS"), None),
    }


class _GeConfig(_Group):
    _PATH = "ge_config"
    _OPTIONS: ClassVar[dict[str, _Opt]] = {
        "enable_single_stream": _Opt(False, _bool(), "ge_config.enable_single_stream"),
        "export_compile_stat": _Opt("1", ("0", "1", "2"), None),
        "optimization_switch": _Opt(None, _ANY, None),
    }


class _NoEffectGroup(_Group):
    """Groups (export, aoe_config, fusion_config, ...) that only steer the NPU toolchain."""

    def __setattr__(self, name: str, value: Any) -> None:
        self._values[name] = value
        _no_effect(self._path(name))

    def __getattr__(self, name: str) -> Any:
        return object.__getattribute__(self, "_values").get(name)


def _named(path: str) -> type[_Group]:
    return type(f"_{path}", (_NoEffectGroup,), {"_PATH": path})


class CompilerConfig(_Group):
    """TorchAir's ``torchair.CompilerConfig`` surface; ``.airstream`` is the config it builds."""

    _OPTIONS: ClassVar[dict[str, _Opt]] = {
        "mode": _Opt("max-autotune", ("max-autotune", "reduce-overhead"), "mode"),
        "post_grad_custom_pre_pass": _Opt(None, _ANY, "post_grad_custom_pre_pass"),
        "post_grad_custom_post_pass": _Opt(None, _ANY, "post_grad_custom_post_pass"),
    }
    _GROUPS: ClassVar[dict[str, type[_Group]]] = {
        "debug": _Debug,
        "experimental_config": _Experimental,
        "ge_config": _GeConfig,
        "export": _named("export"),
        "aoe_config": _named("aoe_config"),
        "fusion_config": _named("fusion_config"),
        "dump_config": _named("dump_config"),
        "inference_config": _named("inference_config"),
    }

    def __init__(self) -> None:
        air = AirConfig()
        # TorchAir's defaults where they differ from airstream's and have an effect here: the
        # whole-graph compile of TorchAir's max-autotune is airstream's max-autotune (Inductor
        # segments per stream).
        air.experimental_config.enable_view_optimize = True
        air.mode = "max-autotune"
        super().__init__(air)
        self._values["mode"] = "max-autotune"

    @property
    def airstream(self) -> AirConfig:
        """The airstream CompilerConfig these options produce."""
        return self._air
