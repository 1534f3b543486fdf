"""Every private torch API airstream relies on, behind one boundary, each with a probe.

torch's private modules (``torch._dynamo``, ``torch._inductor``, ``torch._functorch``,
``torch._C``, ``torch.testing._internal``, ...), private attributes (``OpOverload._schema``) and
the node-meta keys torch's own passes write or read (the partitioner's tag, Inductor's output
strides) change between releases without notice. No other airstream module touches them
(``tests/test_torch_internals.py`` scans the source tree for that); they call the accessors this
package exports. ``registry`` holds the features, probes and checks; ``core``, ``inductor`` and
``tools`` the features of each part of airstream.

Each private API is a :class:`Feature`: a name, the group of airstream functionality that needs it,
what it is used for, and a probe that checks it exists with the shape airstream relies on (an
attribute, a keyword argument, a meta key still read by the torch module that consumes it). A
failing probe raises :class:`~airstream.errors.TorchSupportError` naming the feature, this torch and
the supported range, the first time its group is needed, never a silent fallback:

- import time: the handful of names airstream binds when it is imported (op classes, fake tensors,
  the profiler flag its hot path reads);
- ``core``: at the first compile, all of them at once (one error lists every missing one);
- ``max-autotune``, ``auto-streams``, ``profiler``, ``explain``, ``collectives``, ``selftest``,
  ``testing``: the first time that part is used;
- ``diagnostics`` (reporting only): a missing one warns once and is reported as unknown.

``probe_all()`` runs every probe (``airstream doctor`` prints the result; the test suite requires
all of them on every supported torch).
"""

from __future__ import annotations

from airstream.torch_internals.core import (
    COLLECTIVE_NAMESPACES,
    FakeTensor,
    FakeTensorMode,
    FunctionalizedCall,
    OperatorBase,
    OpOverload,
    OpOverloadPacket,
    annotate,
    aot_autograd,
    aot_module_simplified,
    collective_op_name,
    detect_fake_mode,
    dynamo_skip,
    eval_frame_callback_getter,
    functionalized_call,
    keep_in_forward,
    min_cut_partition,
    module_stack,
    op_name,
    op_schema,
    outputs_rebuilt_from_inputs,
    profiler_enabled,
    set_annotations,
    set_grad_enabled,
    stack_trace,
    static_input_indices,
    stream_annotations,
)
from airstream.torch_internals.cuda import (
    clear_cublas_workspaces,
    cuda_sleep,
    end_allocate_to_pool,
    release_pool,
)
from airstream.torch_internals.inductor import (
    apply_patterns,
    fxgraph_cache_hits,
    inductor_compile,
    inductor_cpp_compiler,
    inductor_decomposition_table,
    pattern_pass,
    pin_output_strides,
    register_pattern,
    tag_original_aten,
    trace_forward,
)
from airstream.torch_internals.registry import (
    FEATURES,
    GROUPS,
    PRIVATE_ATTRIBUTES,
    SUPPORTED_TORCH,
    TESTED_TORCH,
    TORCH_META_KEYS,
    Feature,
    ProbeResult,
    probe,
    probe_all,
    require,
    support_problem,
    torch_release,
)
from airstream.torch_internals.tools import (
    aot_eager,
    collective_op,
    compile_fx,
    dynamo_graph_break,
    dynamo_unsupported,
    fake_store,
    flop_formula,
    functional_collectives,
    lookup_backend,
    mark_dynamic,
    opinfo_database,
    opinfo_tolerance_decorators,
    profile_all_threads_config,
    record_function_enter,
    record_function_exit,
    register_backend,
    remove_from_dynamo_cache,
    size_hint,
    tree_flatten,
    tree_unflatten,
)

__all__ = [
    "trace_forward",
    "register_pattern",
    "pattern_pass",
    "apply_patterns",
    "COLLECTIVE_NAMESPACES",
    "FEATURES",
    "GROUPS",
    "PRIVATE_ATTRIBUTES",
    "SUPPORTED_TORCH",
    "TESTED_TORCH",
    "TORCH_META_KEYS",
    "annotate",
    "aot_autograd",
    "aot_eager",
    "aot_module_simplified",
    "clear_cublas_workspaces",
    "collective_op",
    "collective_op_name",
    "compile_fx",
    "cuda_sleep",
    "detect_fake_mode",
    "dynamo_graph_break",
    "dynamo_skip",
    "dynamo_unsupported",
    "end_allocate_to_pool",
    "eval_frame_callback_getter",
    "functionalized_call",
    "fake_store",
    "FakeTensor",
    "FakeTensorMode",
    "FunctionalizedCall",
    "Feature",
    "flop_formula",
    "functional_collectives",
    "fxgraph_cache_hits",
    "inductor_compile",
    "inductor_cpp_compiler",
    "inductor_decomposition_table",
    "keep_in_forward",
    "lookup_backend",
    "mark_dynamic",
    "min_cut_partition",
    "module_stack",
    "op_name",
    "op_schema",
    "outputs_rebuilt_from_inputs",
    "OperatorBase",
    "opinfo_database",
    "register_backend",
    "opinfo_tolerance_decorators",
    "OpOverload",
    "OpOverloadPacket",
    "pin_output_strides",
    "probe",
    "probe_all",
    "ProbeResult",
    "profile_all_threads_config",
    "profiler_enabled",
    "record_function_enter",
    "record_function_exit",
    "release_pool",
    "remove_from_dynamo_cache",
    "require",
    "set_annotations",
    "set_grad_enabled",
    "size_hint",
    "stack_trace",
    "static_input_indices",
    "stream_annotations",
    "support_problem",
    "tag_original_aten",
    "torch_release",
    "tree_flatten",
    "tree_unflatten",
]
