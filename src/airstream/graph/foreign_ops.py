"""What airstream knows of other libraries' ops beyond their schemas: the process-global state
they share, and the intra-op threads they insist on.

**Shared state.** A CPU stream is a thread, so two streams run their ops at the same time. An op
is safe there only if it keeps no state between calls that another op also uses. torch's own ops
(``aten``, ``prims``, the functional collectives) and airstream's keep none. Other libraries'
ops may:

- **vLLM's CPU kernels** (namespaces ``_C``, in a process that loaded vLLM, and ``vllm``:
  ``onednn_mm``, ``cpu_fused_moe``, attention) write into one scratch buffer per process. It is
  a function-local static, ``cpu_utils::ScratchPadManager::get_scratchpad_manager()::manager``,
  reallocated when a call needs more. Two of these kernels at once read each other's partial
  results or crash (``malloc(): unsorted double linked list corrupted``, seen with the shared
  expert on a side stream). ``objdump -d -C vllm/_C.abi3.so`` shows the static's guard variable.
- **An op airstream does not know** (any other namespace) is treated the same way, with its
  namespace as its state, and named once per process in a warning: ops of one unknown library
  never overlap each other across streams, while each still overlaps torch's ops.

:func:`declare_shared_state` tells airstream otherwise: ``declare_shared_state("mylib", None)``
says the library's ops are safe to run at once; ``declare_shared_state("mylib::fused",
"mylib scratch")`` names the state ops share. The planner orders ops that share a state by graph
order (``schedule/deps.py``, reason ``"shared state"``), like writes to one buffer. Declarations
are read when a graph compiles.

**Work.** Cost models and structural patterns know matrix multiplies by torch's ops and flop
counter; vLLM's CPU build does its linears with ``_C.onednn_mm(c, a, bias, handler)`` (the weight
is behind the handler, invisible to the graph) and its routed experts with one
``_C.cpu_fused_moe``. :func:`matmul_input` and :func:`foreign_flops` say what they compute.

**The caller's threads.** Some ops must run with every intra-op thread the calling thread has:

- vLLM's CPU attention (``vllm::unified_attention_with_output``) checks that it runs on as many
  OpenMP threads as its metadata was built for, outside the graph, on the calling thread
  (``cpu_attn_impl.hpp``: ``Check failed: input->metadata->thread_num == thread_num (2 vs. 1)``);
- vLLM's linears (``_C::onednn_mm``, ``_C::onednn_scaled_mm``) take a oneDNN matmul primitive
  from a per-process cache keyed by the input's rows, stride and bias
  (``dnnl_helper.cpp``: ``MSizeCacheKey``), not by the thread count; oneDNN's brgemm matmul
  fixes its thread count when the primitive is made. A shape first multiplied on one thread runs
  on one thread for good: at M=512 of a 2048 x 512 weight on 2 cores, 4.5 ms against 2.4 ms
  (docs/benchmarks.md, "A measurement that changes what it measures").

Such an op runs on the main stream with no other stream working (the planner orders it after and
before every other stream's work, reason ``"alone"``), which is where the runtime gives the main
stream every thread the caller has (``schedule/overlap.py``), so whichever candidate placement
runs a shape first, it runs it as the caller would. :func:`declare_caller_threads` says the same
of another library's ops. torch's own ops need no such rule: oneDNN's own primitive cache (which
torch's ``mm``, ``linear`` and ``mkldnn._linear_pointwise`` use) keys its primitives by the
thread count.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping
from typing import Any

from airstream.torch_internals import OpOverload, op_name

__all__ = [
    "caller_threads_reason",
    "caller_threads_why",
    "declare_caller_threads",
    "declare_shared_state",
    "known_effects",
    "foreign_flops",
    "matmul_input",
    "needs_caller_threads",
    "shared_state",
]

log = logging.getLogger("airstream")

# Namespaces whose ops keep no state between calls that another op uses.
_SAFE = frozenset(
    {
        "aten",
        "prims",
        "air",  # airstream's own ops
        "npugraph_ex",  # the air ops under TorchAir's names (airstream.compat.torchair)
        "_c10d_functional",  # ordered as collectives instead (schedule/deps.py)
        "_c10d_functional_autograd",
        "c10d",
        "_dtensor",
        "quantized",
        "profiler",  # record_function ranges: per thread
    }
)

_VLLM = "vLLM's CPU scratchpad (cpu_utils::ScratchPadManager, one per process)"
_KNOWN: dict[str, str | None] = {"_C": _VLLM, "vllm": _VLLM}

# Ops that must run with the caller's intra-op threads (see the module docstring), and why.
_ATTENTION = "it checks that it runs on the thread count its metadata was built for"
_PRIMITIVE = (
    "it keeps a oneDNN primitive per shape, made for the thread count of the shape's first call"
)
_CALLER_THREADS: dict[str, str] = {
    "vllm::unified_attention_with_output": _ATTENTION,
    "vllm::unified_attention": _ATTENTION,
    "_C::onednn_mm": _PRIMITIVE,
    "_C::onednn_scaled_mm": _PRIMITIVE,
}

_lock = threading.Lock()
_declared: dict[str, str | None] = {}  # "ns" or "ns::name" -> state (None: safe)
_declared_threads: dict[str, str | None] = {}  # "ns" or "ns::name" -> why (None: need not)
_named: set[str] = set()  # unknown ops already named in a warning


def declare_shared_state(target: str, state: str | None) -> None:
    """Declare what ``target`` (a namespace ``"mylib"`` or an op ``"mylib::name"``) shares.

    ``state=None``: its ops keep no shared state and may run at once on different streams.
    A string: every op declared with that string is ordered against the others (never two at
    once). An op's own declaration wins over its namespace's."""
    _declare(_declared, "declare_shared_state", target, "state", state)


def _declare(
    table: dict[str, str | None], caller: str, target: str, what: str, value: str | None
) -> None:
    """``table[target] = value`` once both are checked (``caller`` and ``what`` name them)."""
    if not isinstance(target, str) or not target or target.count("::") > 1:
        raise ValueError(f"{caller}: target must be 'namespace' or 'namespace::op', got {target!r}")
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{caller}: {what} must be a non-empty string or None, got {value!r}")
    with _lock:
        table[target] = value


def _declared_for(
    table: dict[str, str | None], namespace: str, name: str
) -> tuple[bool, str | None]:
    """Whether ``table`` declares op ``namespace::name`` (its own entry first, then its
    namespace's), and the value declared."""
    with _lock:
        for key in (f"{namespace}::{name}", namespace):
            if key in table:
                return True, table[key]
    return False, None


def shared_state(namespace: str, name: str) -> str | None:
    """The process-global state op ``namespace::name`` shares with other ops, or None."""
    declared, state = _declared_for(_declared, namespace, name)
    if declared:
        return state
    qualified = f"{namespace}::{name}"
    if namespace in _SAFE:
        return None
    if namespace in _KNOWN and (namespace != "_C" or "vllm" in sys.modules):
        return _KNOWN[namespace]  # ``_C`` is vLLM's only in a process that loaded vLLM
    _name_once(qualified, namespace)
    return f"{namespace} (not known to be safe beside itself)"


def _name_once(qualified: str, namespace: str) -> None:
    with _lock:
        if qualified in _named:
            return
        _named.add(qualified)
    log.warning(
        "airstream: %s is not known to airstream; on different streams it never runs at the same "
        "time as another %s op (it may share state with them). If the %s library's ops are safe "
        "to run at once, say so before compiling: "
        "airstream.declare_shared_state(%r, None)",
        qualified,
        namespace,
        namespace,
        namespace,
    )


def declare_caller_threads(target: str, reason: str | None = "declared") -> None:
    """Declare that ``target``'s ops (a namespace ``"mylib"`` or an op ``"mylib::name"``) must
    run with every intra-op thread of the calling thread, ``reason`` saying why (a library that
    keeps state made for the thread count of a first call, or checks the count); ``None``
    declares that they need not. Such an op runs alone on the main stream (the module
    docstring). An op's own declaration wins over its namespace's; read when a graph compiles."""
    _declare(_declared_threads, "declare_caller_threads", target, "reason", reason)


def caller_threads_reason(namespace: str, name: str) -> str | None:
    """Why op ``namespace::name`` must run with every intra-op thread of the calling thread, or
    None where it need not."""
    declared, reason = _declared_for(_declared_threads, namespace, name)
    if declared:
        return reason
    qualified = f"{namespace}::{name}"
    if namespace == "_C" and "vllm" not in sys.modules:
        return None  # ``_C`` is vLLM's only in a process that loaded vLLM
    return _CALLER_THREADS.get(qualified)


def needs_caller_threads(namespace: str, name: str) -> bool:
    """Must op ``namespace::name`` run with every intra-op thread of the calling thread?"""
    return caller_threads_reason(namespace, name) is not None


# Matrix multiplies of other libraries: op -> (its input's argument, its output's argument)
_MATMULS = {"_C::onednn_mm": ("a", "c"), "_C::onednn_scaled_mm": ("a", "c")}


def matmul_input(namespace: str, name: str) -> str | None:
    """The argument holding a matrix multiply's input rows (``a`` of ``onednn_mm``), or None
    when ``namespace::name`` is no matrix multiply airstream knows of another library."""
    found = _MATMULS.get(f"{namespace}::{name}")
    return None if found is None else found[0]


def foreign_flops(namespace: str, name: str, values: Mapping[str, Any]) -> int | None:
    """Floating-point operations of a known op of another library, from its arguments' values
    (tensors or their metadata, by argument name), or None where airstream has no formula."""
    qualified = f"{namespace}::{name}"
    try:
        if qualified in _MATMULS:
            rows, out = values[_MATMULS[qualified][0]], values[_MATMULS[qualified][1]]
            return 2 * rows.numel() * out.shape[-1]
        if qualified == "_C::cpu_fused_moe":  # each token through top-k experts' two matmuls
            tokens, k = values["topk_id"].shape
            w13, w2 = values["w13"].shape, values["w2"].shape
            return 2 * tokens * k * (w13[1] * w13[2] + w2[1] * w2[2])
    except (KeyError, AttributeError, IndexError, TypeError, ValueError):
        return None
    return None


def known_effects(op: Any) -> tuple[str | None, bool]:
    """For an op overload: the state it shares (:func:`shared_state`) and whether it needs the
    caller's threads (:func:`needs_caller_threads`); ``(None, False)`` for anything else."""
    if not isinstance(op, OpOverload):
        return None, False
    namespace, name, _ = op_name(op)
    return shared_state(namespace, name), needs_caller_threads(namespace, name)


def caller_threads_why(targets: Any) -> str | None:
    """For a node's target and arguments (a functionalized call names its op among them): the
    first op's name and why it needs the caller's threads, or None where none does."""
    for op in targets:
        if isinstance(op, OpOverload):
            namespace, name, _ = op_name(op)
            why = caller_threads_reason(namespace, name)
            if why is not None:
                return f"{namespace}::{name}: {why}"
    return None
