"""Graph passes: the pipeline that runs them and the built-ins.

Layer: passes. May import: errors, torch_internals, options, machine, ops, graph, schedule.
"""

from airstream.passes.auto import (
    AutoStreamsDecision,
    auto_streams,
    microbatch_overlap,
    moe_experts,
    overlap_communication,
    shared_expert_overlap,
)
from airstream.passes.manager import STAGES, PassManager, PassResult, PassSpec, pass_name
from airstream.passes.meta import check_meta, fill_meta
from airstream.passes.replacements import Replacements
from airstream.passes.toolkit import (
    add_control_edge,
    graph_kind,
    module_paths,
    place_on_stream,
    select_nodes,
    streams_of,
)

__all__ = [
    "AutoStreamsDecision",
    "Replacements",
    "add_control_edge",
    "auto_streams",
    "graph_kind",
    "microbatch_overlap",
    "module_paths",
    "moe_experts",
    "overlap_communication",
    "place_on_stream",
    "select_nodes",
    "shared_expert_overlap",
    "streams_of",
    "STAGES",
    "PassManager",
    "PassResult",
    "PassSpec",
    "check_meta",
    "fill_meta",
    "pass_name",
]
