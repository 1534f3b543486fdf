"""TorchAir's ``CompilerConfig``: every group and option of TorchAir's, with its defaults, checks
and messages, and the table that turns it into airstream's config.

The groups mirror TorchAir's layout (``debug.aclgraph``, ``experimental_config.aclgraph``,
``ge_config``, ``export.experimental``, ...). :data:`_AIRSTREAM` lists the TorchAir options that
have an effect here and the airstream option each one sets; every other option is accepted,
stored, read back, and warned about once per process ("no effect off the NPU").
:attr:`CompilerConfig.airstream` builds airstream's config from the current values; custom
passes are wrapped so they receive this TorchAir config, as under TorchAir.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from airstream.compat.torchair import patterns
from airstream.compat.torchair.logger import logger
from airstream.compat.torchair.values import (
    Callback,
    Choice,
    Dict,
    Directory,
    File,
    Group,
    IntList,
    IntRange,
    JsonFile,
    Pattern,
    Text,
    Value,
)
from airstream.config import CompilerConfig as AirConfig

__all__ = ["CompilerConfig", "capture_mode"]

INT64_MAX = 2**63 - 1
_BOOL = [True, False]
_warned: set[str] = set()  # NPU-only paths already warned about (one warning each per process)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class _DebugFile(Group):
    """A debug output (graph dump, data dump, FX summary): ``type`` enables it; ``path``."""

    def __init__(self) -> None:
        self._dir = Value(None)
        super().__init__()

    @staticmethod
    def _private() -> tuple[str, ...]:
        return ("_dir",)  # set through the ``path`` property

    @property
    def enabled(self) -> bool:
        return self.type.value is not None  # type: ignore[attr-defined]

    def full_path(self, name: str, *, with_timestap: bool = True) -> str | None:
        """``<path>/<name>_rank_<r>_pid_<pid>[_ts_<utc stamp>].<type>``, TorchAir's file name."""
        if not self.enabled:
            return None
        folder = "." if self._dir.value is None else self._dir.value
        stamp = ""
        if with_timestap:
            stamp = "_ts_" + datetime.now(tz=UTC).strftime("%Y%m%d%H%M%S%f")
        kind = self.type.value  # type: ignore[attr-defined]
        return f"{folder}/{name}_rank_{_rank()}_pid_{os.getpid()}{stamp}.{kind}"


class _PathProperty:
    """``path`` of a debug output: stored as its real path, read back as a str."""

    @property
    def path(self) -> Any:
        return self._dir.value  # type: ignore[attr-defined]

    @path.setter
    def path(self, value: Any) -> None:
        self._dir.value = os.path.realpath(value)  # type: ignore[attr-defined]


class _GraphDump(_PathProperty, _DebugFile):
    def __init__(self) -> None:
        self.type = Choice(None, ["txt", "pbtxt", "py"])
        super().__init__()


class _DataDump(_PathProperty, _DebugFile):
    def __init__(self) -> None:
        self.filter = None
        self.type = Choice(None, ["npy"])
        super().__init__()


class _FxSummary(_DebugFile):
    def __init__(self) -> None:
        self.type = Choice(None, ["csv"])
        self.skip_compile = Choice(True, _BOOL)
        super().__init__()


class _AclGraphDebug(Group):
    def __init__(self) -> None:
        self.disable_reinplace_inplaceable_ops_pass = Choice(False, _BOOL)
        self.disable_reinplace_input_mutated_ops_pass = Choice(False, _BOOL)
        self.disable_mempool_reuse_in_same_fx = Choice(False, _BOOL)
        self.enable_output_clone = Choice(False, _BOOL)
        self.static_capture_size_limit = IntRange(64, 1, INT64_MAX)
        self.clone_input = Choice(True, _BOOL)
        self.remove_cat_ops = Choice(True, _BOOL)
        super().__init__()


class _Debug(Group):
    def __init__(self) -> None:
        self.graph_dump = _GraphDump()
        self.data_dump = _DataDump()
        self.fx_summary = _FxSummary()
        self.run_eagerly = Choice(False, _BOOL)
        self.aclgraph = _AclGraphDebug()
        self.deadlock_check = Choice(False, _BOOL)
        super().__init__()


class _AclGraphExperimental(Group):
    _NAMES = (
        "_aclnn_static_shape_kernel",
        "_aclnn_static_shape_kernel_build_dir",
        "_aclnn_static_shape_kernel_sym_value_range",
        "_aclnn_static_shape_kernel_sym_index",
        "_super_kernel_optimize",
        "_super_kernel_optimize_options",
        "_super_kernel_debug_options",
    )

    def __init__(self) -> None:
        self._aclnn_static_shape_kernel = Choice(False, _BOOL)
        self._aclnn_static_shape_kernel_build_dir = Text()
        self._aclnn_static_shape_kernel_sym_value_range = IntList(None)
        self._aclnn_static_shape_kernel_sym_index = IntRange(0, 0, INT64_MAX)
        self._super_kernel_optimize = Choice(False, _BOOL)
        self._super_kernel_optimize_options = Dict(None)
        self._super_kernel_debug_options = Dict(None)
        super().__init__()

    @staticmethod
    def _private() -> tuple[str, ...]:
        return _AclGraphExperimental._NAMES


class _Experimental(Group):
    def __init__(self) -> None:
        self.cc_parallel_enable = Choice(False, [False, True])
        self.keep_inference_input_mutations = Choice(True, _BOOL)
        self.memory_efficiency = Choice(False, _BOOL)
        self.frozen_parameter = Choice(False, _BOOL)
        self.static_model_ops_lower_limit = IntRange(None, -1, INT64_MAX)
        self.jit_compile = Choice("auto", ["auto"])
        self.npu_fx_pass = Choice(False, _BOOL)
        self.aot_config_enable_joint_graph = Choice(False, _BOOL)
        self.aot_config_output_loss_index = Value(0)
        self.topology_sorting_strategy = Choice("DFS", ["BFS", "DFS", "RDFS", "StableRDFS"])
        self.enable_ref_data = Choice(False, _BOOL)
        self.enable_view_optimize = Choice(True, _BOOL)
        self.remove_noop_ops = Choice(True, _BOOL)
        self.tiling_schedule_optimize = Choice(False, _BOOL)
        self.pattern_fusion_pass = Choice(True, _BOOL)
        self.aclgraph = _AclGraphExperimental()
        super().__init__()


class _Ge(Group):
    def __init__(self) -> None:
        self.enable_single_stream = Choice(False, _BOOL)
        self.oo_level = Choice("O3", ["O1", "O3"])
        self.oo_constant_folding = Choice(None, _BOOL)
        self.oo_dead_code_elimination = Choice(None, _BOOL)
        self.export_compile_stat = Choice("2", ["0", "1", "2"])
        self.aicore_num = Value(None)
        self.optimization_switch = Value(None)
        super().__init__()


class _ExportExperimental(Group):
    def __init__(self) -> None:
        self.enable_record_nn_module_stack = Choice(False, _BOOL)
        self.auto_atc_config_generated = Choice(False, _BOOL)
        self.enable_lite_export = Choice(False, _BOOL)
        super().__init__()


class _Export(Group):
    def __init__(self) -> None:
        self.export_mode = Choice(False, [False, True])
        self.export_path_dir = Directory("./")
        self.export_name = None
        self.weight_name = None
        self.inputs_name = None
        self.experimental = _ExportExperimental()
        super().__init__()


class _Aoe(Group):
    def __init__(self) -> None:
        self.aoe_mode = Choice(None, ["2"])
        self.work_path = Directory("./")
        self.aoe_config_file = File(None)
        super().__init__()


class _DataDumpConfig(Group):
    def __init__(self) -> None:
        self.enable_dump = Choice(False, [False, True])
        self.dump_path = Directory("./")
        self.dump_mode = Choice("all", ["input", "output", "all"])
        self.quant_dumpable = Choice(False, [False, True])
        self.dump_step = Pattern("", r"^(((\d+)|(\d+-{0,1}\d+))\|{0,1})*$", "0|1|2-5|6")
        self.dump_layer = Pattern("", r'^[0-9a-zA-Z_" "/\\.]*$', "Mul_1 Add1 Conv2D_1")
        self.dump_data = Choice("tensor", ["tensor", "stats"])
        self.dump_config_path = JsonFile(None)
        self.data_dump_stage = Choice("optimized", ["original", "optimized"])
        super().__init__()


class _Fusion(Group):
    def __init__(self) -> None:
        self.fusion_switch_file = File(None)
        super().__init__()


class _Inference(Group):
    def __init__(self) -> None:
        self.dynamic_gears_merge_policy = Choice("zip", ["zip", "product"])
        super().__init__()


class _AclGraphConfig(Group):
    """``aclgraph_config``: an open namespace in TorchAir (``use_custom_pool``, any other name)."""

    _OPEN = True

    def __init__(self) -> None:
        self.use_custom_pool = None
        super().__init__()


class _NpuGraphExConfig(Group):
    """``npugraphex_config``: empty in TorchAir."""


def _graph_name(gm: Any) -> str:
    """TorchAir's name for the graph in its logs: ``backward`` or ``forward`` (inference too)."""
    nodes = getattr(getattr(gm, "graph", None), "nodes", ())
    backward = any(n.op == "placeholder" and n.name.startswith("tangents") for n in nodes)
    return "backward" if backward else "forward"


class _TorchairPass:
    """A custom pass set on the TorchAir config: called as ``fn(gm, example_inputs, config)``
    with that TorchAir config, as TorchAir calls it (airstream's own config is not passed), and
    logged before and after on the ``torchair`` logger in TorchAir's words."""

    def __init__(self, fn: Callable[..., Any], config: CompilerConfig, slot: str) -> None:
        self.fn, self.config, self.slot = fn, config, slot
        functools.update_wrapper(self, fn)  # the pass's name in errors

    def __call__(self, gm: Any, example_inputs: Any, _config: Any = None) -> Any:
        name = _graph_name(gm)
        logger.debug("[%s] before [%s] execution, graph is: %s", name, self.slot, gm.graph)
        result = self.fn(gm, example_inputs, self.config)
        logger.debug("[%s] after [%s] execution, graph is: %s", name, self.slot, gm.graph)
        return result

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _TorchairPass):
            return NotImplemented
        return (self.fn, self.slot) == (other.fn, other.slot) and self.config is other.config

    def __hash__(self) -> int:
        return hash((id(self.fn), id(self.config), self.slot))

    def __repr__(self) -> str:
        return f"{self.fn!r} (called with the TorchAir CompilerConfig)"


@dataclass(frozen=True)
class _Sets:
    """A TorchAir option that works here: it sets airstream's ``target`` option."""

    target: str
    convert: Callable[[Any, CompilerConfig], Any] = lambda value, config: value


def capture_mode(config: CompilerConfig) -> bool:
    """TorchAir's graph-capture modes (aclgraph), where its reinplace passes run."""
    return config.mode.value in ("reduce-overhead", "npugraph_ex")


def _wrap_pass(slot: str) -> Callable[[Any, CompilerConfig], Any]:
    def wrap(value: Any, config: CompilerConfig) -> Any:
        return None if value is None else _TorchairPass(value, config, slot)

    return wrap


_AIRSTREAM: dict[str, _Sets] = {
    # TorchAir's npugraph_ex (graph capture and replay) is airstream's reduce-overhead
    "mode": _Sets("mode", lambda v, c: "reduce-overhead" if v == "npugraph_ex" else v),
    "post_grad_custom_pre_pass": _Sets(
        "post_grad_custom_pre_pass", _wrap_pass("post_grad_custom_pre_pass")
    ),
    "post_grad_custom_post_pass": _Sets(
        "post_grad_custom_post_pass", _wrap_pass("post_grad_custom_post_pass")
    ),
    "debug.run_eagerly": _Sets("debug.run_eagerly"),
    "debug.graph_dump.type": _Sets(
        "debug.graph_dump.type",
        lambda v, c: "txt" if v == "pbtxt" else v,  # pbtxt: GE's format
    ),
    "debug.graph_dump._dir": _Sets("debug.graph_dump.path", lambda v, c: v or "."),
    "debug.data_dump.type": _Sets("debug.data_dump.type"),
    "debug.data_dump._dir": _Sets("debug.data_dump.path", lambda v, c: v or "."),
    "debug.data_dump.filter": _Sets("debug.data_dump.filter"),
    "experimental_config.keep_inference_input_mutations": _Sets(
        "experimental_config.keep_inference_input_mutations"
    ),
    "experimental_config.remove_noop_ops": _Sets("experimental_config.remove_noop_ops"),
    "experimental_config.enable_view_optimize": _Sets("experimental_config.enable_view_optimize"),
    "ge_config.enable_single_stream": _Sets("ge_config.enable_single_stream"),
    # TorchAir rewrites ops in place in its graph-capture modes only
    "debug.aclgraph.disable_reinplace_inplaceable_ops_pass": _Sets(
        "experimental_config.reinplace_inplaceable_ops", lambda v, c: capture_mode(c) and not v
    ),
    "debug.aclgraph.disable_reinplace_input_mutated_ops_pass": _Sets(
        "experimental_config.reinplace_input_mutations", lambda v, c: capture_mode(c) and not v
    ),
}
# TorchAir options that act here without an airstream option of their own (read in .airstream)
_READ_HERE = frozenset({"experimental_config.pattern_fusion_pass"})
_SETTABLE_ALIASES = {
    "debug.graph_dump.path": "debug.graph_dump._dir",
    "debug.data_dump.path": "debug.data_dump._dir",
}


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
        self.mode = Choice("max-autotune", ["max-autotune", "reduce-overhead", "npugraph_ex"])
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
