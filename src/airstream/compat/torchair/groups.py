"""TorchAir's option groups under its ``CompilerConfig``, with TorchAir's defaults and checks.

The layout is TorchAir's (``debug.aclgraph``, ``experimental_config.aclgraph``, ``ge_config``,
``export.experimental``, ...): the same names, defaults, allowed values and messages, so TorchAir
code runs unchanged and its tests match. Which of these options act off the NPU, and the
airstream option each sets, is :mod:`airstream.compat.torchair.mapping`'s table.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from airstream.compat.torchair.values import (
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

# The classes keep their private names: TorchAir's messages show them ("_Debug has no option x").
__all__ = ["INT64_MAX"]

INT64_MAX = 2**63 - 1
_BOOL = [True, False]


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
