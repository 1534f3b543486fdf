"""The TorchAir backend: airstream's backend built from a TorchAir config, taking TorchAir's
``torch.compile(..., options={...})`` names (npugraph_ex's: ``force_eager``, ``clone_input``,
``inplace_pass``, ...), each mapped onto a TorchAir option path as TorchAir maps it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from airstream.backend import AirstreamBackend
from airstream.compat.torchair.config import CompilerConfig
from airstream.compat.torchair.mapping import capture_mode
from airstream.options.config import CompilerConfig as AirConfig

__all__ = ["OPTION_PATHS", "TorchairBackend"]

# option name: the TorchAir config path it sets
OPTION_PATHS: dict[str, str] = {
    "_vllm_aclnn_static_kernel_sym_index": (
        "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_index"
    ),
    "_vllm_aclnn_static_kernel_sym_range": (
        "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range"
    ),
    "static_kernel_compile": "experimental_config.aclgraph._aclnn_static_shape_kernel",
    "super_kernel_optimize": "experimental_config.aclgraph._super_kernel_optimize",
    "super_kernel_optimize_options": "experimental_config.aclgraph._super_kernel_optimize_options",
    "super_kernel_debug_options": "experimental_config.aclgraph._super_kernel_debug_options",
    "inplace_pass": "debug.aclgraph.disable_reinplace_inplaceable_ops_pass",
    "input_inplace_pass": "debug.aclgraph.disable_reinplace_input_mutated_ops_pass",
    "remove_noop_ops": "experimental_config.remove_noop_ops",
    "remove_cat_ops": "debug.aclgraph.remove_cat_ops",
    "force_eager": "debug.run_eagerly",
    "pattern_fusion_pass": "experimental_config.pattern_fusion_pass",
    "clone_input": "debug.aclgraph.clone_input",
    "frozen_parameter": "experimental_config.frozen_parameter",
    "post_grad_custom_pre_pass": "post_grad_custom_pre_pass",
    "post_grad_custom_post_pass": "post_grad_custom_post_pass",
    "use_graph_pool": "aclgraph_config.use_custom_pool",
    "reuse_graph_pool_in_same_fx": "debug.aclgraph.disable_mempool_reuse_in_same_fx",
    "capture_limit": "debug.aclgraph.static_capture_size_limit",
    "clone_output": "debug.aclgraph.enable_output_clone",
    "dump_tensor_data": "dump_config.enable_dump",
    "data_dump_stage": "dump_config.data_dump_stage",
    "data_dump_dir": "dump_config.dump_path",
}
# options whose path says the opposite ("inplace_pass" sets "disable_..._pass")
_INVERTED = {"inplace_pass", "input_inplace_pass", "reuse_graph_pool_in_same_fx"}


def _invert(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int) and value in (0, 1):
        return 1 - value
    return value


def apply_options(config: CompilerConfig, options: Mapping[str, Any]) -> None:
    """Set ``options`` (TorchAir's names) on ``config``; an unknown name raises ValueError."""
    for name, value in options.items():
        if name not in OPTION_PATHS:
            raise ValueError(f"Invalid option '{name}', allowed options: {sorted(OPTION_PATHS)}")
        *groups, leaf = OPTION_PATHS[name].split(".")
        node: Any = config
        for group in groups:
            node = getattr(node, group)
        setattr(node, leaf, _invert(value) if name in _INVERTED else value)


class TorchairBackend(AirstreamBackend):
    """``torchair.get_npu_backend(...)``: compiles with ``torchair_config.airstream``."""

    def __init__(
        self,
        torchair_config: CompilerConfig,
        decompositions: Mapping[Any, Callable[..., Any]] | None = None,
    ) -> None:
        super().__init__(torchair_config.airstream, decompositions)
        self.torchair_config = torchair_config

    def config_for(self, compile_kwargs: Mapping[str, Any]) -> AirConfig:
        """The TorchAir config as it is now (TorchAir reads it at compile time), with
        ``options`` in TorchAir's names applied to a copy."""
        unknown = sorted(set(compile_kwargs) - {"options", "mode"})
        if unknown:
            raise ValueError(f"the TorchAir backend takes options= and mode=, not {unknown}")
        torchair_config = self.torchair_config
        if compile_kwargs.get("options"):
            torchair_config = copy.deepcopy(torchair_config)
            apply_options(torchair_config, compile_kwargs["options"])
        dump_type = torchair_config.debug.graph_dump.type.value
        if capture_mode(torchair_config) and dump_type not in (None, "py"):
            # TorchAir's graph-capture modes dump their graphs as Python only
            raise RuntimeError(
                f"Graph dump for aclGraph only support 'py' type, but got: {dump_type}"
            )
        config = torchair_config.airstream
        mode = compile_kwargs.get("mode")
        if mode not in (None, "default"):
            config.mode = mode
        return config
