"""CompilerConfig: airstream's options, grouped like TorchAir's, validated on assignment.

Every option lives at a dotted path (``"debug.run_eagerly"``); ``torch.compile(...,
backend="airstream", options={...})`` takes the same paths. Unknown names and bad values raise
:class:`~airstream.errors.ConfigError` naming the valid choices; a pass slot given something
that is not callable, or cannot be called as ``fn(gm, example_inputs, config)``, raises
``TypeError``.

The machinery (:class:`~airstream.options.schema.Option`,
:class:`~airstream.options.schema.OptionGroup` and the checks) lives in
:mod:`airstream.options.schema`. The TorchAir config (:mod:`airstream.compat.torchair.config`)
follows TorchAir's own object model and is translated into this one
(:mod:`airstream.compat.torchair.mapping`). The environment variables airstream reads are declared
in :mod:`airstream.machine.environment`.
"""

from __future__ import annotations

from airstream.options.checks import (
    PassSlot,
    boolean,
    choice,
    directory,
    gain,
    pass_slot,
    positive_int,
    size_bounds,
    thread_counts,
)
from airstream.options.schema import Option, OptionGroup

__all__ = ["CUDA_GRAPH_RERECORD_LIMIT", "CompilerConfig", "PassSlot"]

# How many times a CUDA graph is captured again because a parameter or buffer is a new tensor:
# the bound cudagraph trees have (torch._inductor.config.triton.cudagraph_unexpected_rerecord_limit)
CUDA_GRAPH_RERECORD_LIMIT = 128


class GraphDumpConfig(OptionGroup):
    """``debug.graph_dump``: which graph dumps to write and where."""

    _PATH = "debug.graph_dump"
    _OPTIONS = {
        "type": Option(None, choice(None, "txt", "py", "dot", "svg"), "dump format, None = off"),
        "path": Option(".", directory, "directory the dumps are written to"),
        "naming": Option(
            "numbered",
            choice("numbered", "torchair"),
            "numbered: NNN_<graph>_<step> per step; torchair: TorchAir's names, "
            "dynamo_original_graph_* and dynamo_optimized_graph_* only",
        ),
    }


def _filter(path: str, value: object) -> object:
    if value is not None and not callable(value):
        raise TypeError(f"{path} must be None or a callable filter(node) -> node | None")
    return value


class DataDumpConfig(OptionGroup):
    """``debug.data_dump``: save every op's tensors while the graph runs serially."""

    _PATH = "debug.data_dump"
    _OPTIONS = {
        "type": Option(None, choice(None, "npy"), "npy: dump each op's inputs/outputs; None = off"),
        "path": Option(".", directory, "directory the worldsize*_global_rank* folders go in"),
        "filter": Option(None, _filter, "filter(node) -> node to dump, or None to skip it"),
    }


class DebugConfig(OptionGroup):
    """``debug``: dumps, reference execution and pass verification."""

    _PATH = "debug"
    _GROUPS = {"graph_dump": GraphDumpConfig, "data_dump": DataDumpConfig}
    _OPTIONS = {
        "run_eagerly": Option(
            False, boolean, "run the optimized graph serially, in graph order (reference)"
        ),
        "verify_passes": Option(
            False, boolean, "lint the graph and re-check node metadata after every pass"
        ),
        "strict_max_autotune": Option(
            False,
            boolean,
            "max-autotune: a segment Inductor cannot compile is an error (default: it runs as "
            "aten code, logged once)",
        ),
    }


class ExperimentalConfig(OptionGroup):
    """``experimental_config``: switches for the built-in passes and AOTAutograd."""

    _PATH = "experimental_config"
    _OPTIONS = {
        "remove_noop_ops": Option(
            True, boolean, "built-in pass: drop view ops that return their input unchanged"
        ),
        "enable_view_optimize": Option(
            False, boolean, "built-in pass: rewrite view/_unsafe_view as reshape"
        ),
        "eliminate_dead_code": Option(True, boolean, "built-in pass: dead-code elimination"),
        "cse": Option(True, boolean, "built-in pass: common-subexpression elimination"),
        "keep_inference_input_mutations": Option(
            True, boolean, "keep input mutations (copy_) inside inference graphs"
        ),
        "reinplace_inplaceable_ops": Option(
            False,
            boolean,
            "built-in pass (last): an op on a dead temporary writes it in place "
            "(clone().add(1) -> add_)",
        ),
        "reinplace_input_mutations": Option(
            False,
            boolean,
            "built-in pass (last): an input's write-back is folded into the op computing it "
            "(mul + copy_ -> mul_; custom ops called directly)",
        ),
        "cuda_graph_rerecord_limit": Option(
            CUDA_GRAPH_RERECORD_LIMIT,
            positive_int,
            "reduce-overhead on CUDA: how many times a graph is captured again because a "
            "parameter or buffer is a new tensor (as cudagraph trees' "
            "cudagraph_unexpected_rerecord_limit); past it, one warning and the graph runs on "
            "streams without capture",
        ),
        "min_segment_ops": Option(
            2,
            positive_int,
            "max-autotune: shortest run of fusible ops compiled by Inductor (shorter runs stay "
            "aten calls: one op alone gains no fusion)",
        ),
    }


class GeConfig(OptionGroup):
    """``ge_config``: TorchAir's graph-engine options that have a meaning off the NPU."""

    _PATH = "ge_config"
    _OPTIONS = {
        "enable_single_stream": Option(
            False, boolean, "ignore every stream label and run all nodes on the main stream"
        ),
    }


class StreamConfig(OptionGroup):
    """``stream_config``: how stream workers run."""

    _PATH = "stream_config"
    _OPTIONS = {
        "threads_per_stream": Option(1, positive_int, "CPU intra-op threads in each stream worker"),
        "release_openmp_threads": Option(
            True,
            boolean,
            "before each multi-stream CPU call, release the calling thread's idle OpenMP threads "
            "where the policy in force lets them spin long (they take the cores the streams need "
            "after the caller's own torch work; see `airstream doctor`)",
        ),
        "openmp_team": Option(
            True,
            boolean,
            "run CPU side streams on the calling thread's own OpenMP team (one thread per stream, "
            "no handoff to a sleeping thread) where torch runs on GNU OpenMP and "
            "threads_per_stream is 1; False: a worker thread per side stream",
        ),
        "measure_placement": Option(
            "auto",
            choice("auto", True, False),
            "keep the streams the passes placed only where they measure faster than one stream: "
            "a CPU graph on several streams is compiled on one stream too, the two "
            "run in turn over its first calls and the slower one is dropped; 'auto': where "
            "auto_streams placed them or microbatch_overlap split the graph (measured against "
            "the graph unsplit), True: any placement, False: none",
        ),
        "measure_calls": Option(
            8, positive_int, "measure_placement: timed calls of each candidate before deciding"
        ),
        "measure_min_gain": Option(
            0.03,
            gain,
            "measure_placement: how much faster than one stream the placement must be to stay "
            "(0.03: its median call 1.03x faster)",
        ),
        "measure_ranges": Option(
            "pow2",
            size_bounds,
            "measure_placement, for a graph compiled with dynamic sizes: a decision per size "
            "range, measured on the first calls in each; 'pow2': ranges 1, 2..3, 4..7, ...; "
            "or upper bounds such as (1, 256): ranges 0..1, 2..256, 257..",
        ),
        "measure_threads": Option(
            "auto",
            thread_counts,
            "measure_placement: the placement is measured with these intra-op threads per "
            "stream too, beside threads_per_stream (each another compile); 'auto': the "
            "process's intra-op threads split evenly over the placement's streams, where that "
            "differs from threads_per_stream; () for none",
        ),
    }


class CompilerConfig(OptionGroup):
    """All of airstream's options.

    Example::

        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = my_pass
        config.debug.run_eagerly = True
        config.set_option("ge_config.enable_single_stream", True)
    """

    _OPTIONS = {
        "mode": Option(
            "default",
            choice("default", "reduce-overhead", "max-autotune"),
            "reduce-overhead: generated aten code (CUDA: one CUDA graph); max-autotune: Inductor "
            "segments per stream; default: max-autotune on CPU, reduce-overhead on CUDA, or "
            "$AIRSTREAM_MODE (see airstream.graph.mode)",
        ),
        "post_grad_custom_pre_pass": Option(None, pass_slot, "pass(es) run before built-ins"),
        "post_grad_custom_post_pass": Option(None, pass_slot, "pass(es) run after built-ins"),
    }
    _GROUPS = {
        "debug": DebugConfig,
        "experimental_config": ExperimentalConfig,
        "ge_config": GeConfig,
        "stream_config": StreamConfig,
    }

    def copy(self) -> CompilerConfig:
        """An independent copy with the same values."""
        return CompilerConfig.from_options(self.as_dict())
