"""TorchAir's ``CompilerConfig``: the root of TorchAir's option groups, and the airstream
config it makes.

TorchAir code reads ``config.mode.value`` and TorchAir's tests match its messages, so the
config follows TorchAir's object model (:mod:`~airstream.compat.torchair.values`: groups of
leaves with ``.value``) and layout (:mod:`~airstream.compat.torchair.groups`). It is a view onto
airstream's options: :attr:`CompilerConfig.airstream` builds airstream's config from the
current values through :mod:`~airstream.compat.torchair.mapping`'s table (``_AIRSTREAM``, the
mode table ``MODES``); every other option is accepted, stored, read back, and warned about once
per process ("no effect off the NPU").
"""

from __future__ import annotations

import warnings
from typing import Any

from airstream.compat.torchair import patterns
from airstream.compat.torchair.groups import (
    _AclGraphConfig,
    _Aoe,
    _DataDumpConfig,
    _Debug,
    _Experimental,
    _Export,
    _Fusion,
    _Ge,
    _Inference,
    _NpuGraphExConfig,
)
from airstream.compat.torchair.mapping import _AIRSTREAM, _READ_HERE, _SETTABLE_ALIASES, MODES
from airstream.compat.torchair.values import Callback, Choice, Group, Value
from airstream.options.config import CompilerConfig as AirConfig

__all__ = ["CompilerConfig", "npu_only_paths"]

_warned: set[str] = set()  # NPU-only paths already warned about (one warning each per process)


class CompilerConfig(Group):
    """TorchAir's ``torchair.CompilerConfig``; ``.airstream`` is the airstream config it makes."""

    def __init__(self) -> None:
        self.debug = _Debug()
        self.aoe_config = _Aoe()
        self.export = _Export()
        self.dump_config = _DataDumpConfig()
        self.fusion_config = _Fusion()
        self.experimental_config = _Experimental()
        self.inference_config = _Inference()
        self.ge_config = _Ge()
        self.aclgraph_config = _AclGraphConfig()
        self.npugraphex_config = _NpuGraphExConfig()
        self.mode = Choice("max-autotune", list(MODES))  # TorchAir's default and modes
        self.post_grad_custom_pre_pass = Callback(None)
        self.post_grad_custom_post_pass = Callback(None)
        super().__init__()

    def _changed(self, path: str, value: Any) -> None:
        path = _SETTABLE_ALIASES.get(path, path)
        if path in _AIRSTREAM or path in _READ_HERE or path in _warned:
            return
        _warned.add(path)
        warnings.warn(
            f"airstream.compat.torchair: option {path!r} has no effect off the NPU; accepted "
            "and ignored",
            stacklevel=3,
        )

    @property
    def airstream(self) -> AirConfig:
        """The airstream config these options make (built afresh on each read)."""
        air = AirConfig()
        for path, leaf in self.leaves():
            rule = _AIRSTREAM.get(path)
            if rule is not None:
                raw = leaf.raw if isinstance(leaf, Value) else leaf
                air.set_option(rule.target, rule.convert(raw, self))
        air.debug.graph_dump.naming = "torchair"  # TorchAir's dump file names
        fusions = patterns.registered()
        if self.experimental_config.pattern_fusion_pass.raw and fusions is not None:
            # TorchAir applies its registered fusion rules after the custom post pass
            post = air.post_grad_custom_post_pass
            air.post_grad_custom_post_pass = [*([] if post is None else [post]), fusions]
        return air

    def as_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``({option name: TorchAir value}, {})`` for every option that is set (not None)."""
        local = {
            path.rsplit(".", 1)[-1]: leaf.value
            for path, leaf in self.leaves()
            if isinstance(leaf, Value) and leaf.value is not None and not path.endswith("pass")
        }
        return local, {}


def npu_only_paths() -> list[str]:
    """Every TorchAir option path with no effect off the NPU."""
    paths = [p for p, _ in CompilerConfig().leaves()]
    acting = _AIRSTREAM.keys() | _READ_HERE
    return [p for p in paths if _SETTABLE_ALIASES.get(p, p) not in acting]
