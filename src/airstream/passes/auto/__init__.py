"""Passes that assign streams automatically."""

from airstream.passes.auto.auto_streams import AutoStreamsDecision, auto_streams
from airstream.passes.auto.microbatch import microbatch_overlap
from airstream.passes.auto.moe_experts import moe_experts
from airstream.passes.auto.overlap import overlap_communication
from airstream.passes.auto.shared_expert import shared_expert_overlap

__all__ = [
    "AutoStreamsDecision",
    "auto_streams",
    "microbatch_overlap",
    "moe_experts",
    "overlap_communication",
    "shared_expert_overlap",
]
