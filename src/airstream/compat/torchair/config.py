"""TorchAir's ``CompilerConfig``: a table of TorchAir option paths over airstream's machinery.

Each entry of ``_TABLE`` either sets an airstream option (:func:`_sets`, optionally converting
the value) or has no effect off the NPU (:func:`_npu_only`: accepted, stored so it reads back,
one warning per path); a path ending in ``*`` makes a whole group NPU-only. A value TorchAir
rejects raises ``ValueError`` (a :class:`~airstream.errors.ConfigError`) listing the optional
values, as TorchAir does. New options and groups are new table entries.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airstream.config import CompilerConfig as AirConfig
from airstream.options import (
    Check,
    Invalid,
    Option,
    OptionGroup,
    anything,
    boolean,
    choice,
    directory,
    pass_slot,
)

__all__ = ["CompilerConfig"]

_warned: set[str] = set()  # NPU-only paths already warned about


@dataclass(frozen=True)
class _SetAirstream:
    """Effect of a TorchAir option that works here: set airstream's ``target`` path."""

    target: str | None  # None: the same path as the TorchAir option
    convert: Callable[[Any], Any] | None = None

    def __call__(self, root: OptionGroup, path: str, value: Any) -> None:
        assert isinstance(root, CompilerConfig)
        root.airstream.set_option(
            self.target or path, self.convert(value) if self.convert else value
        )


def _warn_no_effect(root: OptionGroup, path: str, value: Any) -> None:
    if path not in _warned:
        _warned.add(path)
        warnings.warn(
            f"airstream.compat.torchair: option {path!r} has no effect off the NPU; accepted "
            "and ignored",
            stacklevel=3,
        )


def _sets(
    default: Any,
    check: Check,
    *,
    target: str | None = None,
    convert: Callable[[Any], Any] | None = None,
) -> Option:
    """A TorchAir option that sets airstream's ``target`` (default: the same path)."""
    return Option(default, check, effect=_SetAirstream(target, convert))


def _npu_only(default: Any = None, check: Check = anything) -> Option:
    """A TorchAir option with no effect off the NPU: checked, stored, warned about once."""
    return Option(default, check, effect=_warn_no_effect)


def _pbtxt_as_txt(value: Any) -> Any:
    return "txt" if value == "pbtxt" else value  # pbtxt is GE's graph format


def _lower_limit(path: str, value: Any) -> Any:
    if value is None or (isinstance(value, int) and value >= -1):
        return value
    raise Invalid("None or an int >= -1")


_TABLE: dict[str, Option] = {
    "mode": _sets("max-autotune", choice("max-autotune", "reduce-overhead")),
    "post_grad_custom_pre_pass": _sets(None, pass_slot),
    "post_grad_custom_post_pass": _sets(None, pass_slot),
    "debug.run_eagerly": _sets(False, boolean),
    "debug.graph_dump.type": _sets(None, choice(None, "txt", "pbtxt", "py"), convert=_pbtxt_as_txt),
    "debug.graph_dump.path": _sets(".", directory),
    "debug.fx_summary": _npu_only(),
    "debug.data_dump": _npu_only(),
    "experimental_config.keep_inference_input_mutations": _sets(True, boolean),
    "experimental_config.remove_noop_ops": _sets(True, boolean),
    "experimental_config.enable_view_optimize": _sets(True, boolean),
    "experimental_config.cc_parallel_enable": _npu_only(False, boolean),
    "experimental_config.memory_efficiency": _npu_only(False, boolean),
    "experimental_config.frozen_parameter": _npu_only(False, boolean),
    "experimental_config.static_model_ops_lower_limit": _npu_only(None, _lower_limit),
    "experimental_config.jit_compile": _npu_only("auto", choice("auto")),
    "experimental_config.npu_fx_pass": _npu_only(False, boolean),
    "experimental_config.tiling_schedule_optimize": _npu_only(False, boolean),
    "experimental_config.topology_sorting_strategy": _npu_only(
        "DFS", choice("BFS", "DFS", "RDFS", "StableRDFS")
    ),
    "ge_config.enable_single_stream": _sets(False, boolean),
    "ge_config.export_compile_stat": _npu_only("1", choice("0", "1", "2")),
    "ge_config.optimization_switch": _npu_only(),
    "export.*": _npu_only(),
    "aoe_config.*": _npu_only(),
    "fusion_config.*": _npu_only(),
    "dump_config.*": _npu_only(),
    "inference_config.*": _npu_only(),
}


def _targets() -> dict[str, str]:
    """``{TorchAir path: the airstream path it sets}``."""
    return {
        path: opt.effect.target or path
        for path, opt in _TABLE.items()
        if isinstance(opt.effect, _SetAirstream)
    }


class CompilerConfig(OptionGroup, table=_TABLE):
    """TorchAir's ``torchair.CompilerConfig`` surface; ``.airstream`` is the config it builds."""

    _NOUN = "TorchAir option"
    _ALLOWED = "optional values"
    _air: AirConfig

    def __init__(self) -> None:
        object.__setattr__(self, "_air", AirConfig())
        super().__init__()
        # TorchAir's defaults where they differ and have an effect here: TorchAir's max-autotune
        # is airstream's (Inductor segments per stream); view optimization is on.
        for path, opt in _TABLE.items():
            if isinstance(opt.effect, _SetAirstream):
                opt.effect(self, path, opt.default)

    @property
    def airstream(self) -> AirConfig:
        """The airstream CompilerConfig these options produce."""
        return self._air
