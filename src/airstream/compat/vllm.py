"""airstream as vLLM's compile backend: the objects a ``compilation_config`` names.

vLLM (0.32) hands the whole model graph to a custom backend in its compilation modes 1 (stock
``torch.compile``) and 2 (Dynamo traces once), never in mode 3, its own piecewise compile; on
CPU it rewrites mode 3 to mode 2 with Inductor, replacing any backend. ``backend`` is a name
registered with Dynamo or the qualified name of a backend object; vLLM passes no options. So::

    from vllm import LLM
    llm = LLM(model=..., compilation_config={
        "mode": 2, "backend": "airstream.compat.vllm.shared_expert"})

Objects here, each built once at import from a :class:`~airstream.CompilerConfig` with
``reinplace_input_mutations`` on (in reduce-overhead, vLLM's ``out=`` ops called directly, as
Inductor calls them in max-autotune's segments):

- ``one_stream``: no pass;
- ``shared_expert``: :func:`~airstream.passes.shared_expert_overlap` on the modules vLLM's MoE
  models name ``shared_expert`` (Qwen2-MoE, Qwen3-Next, DeepSeek's ``shared_experts``);
- ``auto_streams``: :func:`~airstream.passes.auto_streams`, its placement kept only in the size
  ranges where it measures faster than one stream (``stream_config.measure_placement``).

**Decided before it serves.** ``auto_streams`` keeps a placement per size range only where it
measures faster (``stream_config.measure_placement``), on the first calls of each range. vLLM's
CPU warm-up makes one call (its profile run, at ``max_num_batched_tokens``), so without more the
first live steps of every other range would pay for the measuring. :func:`warm_up` measures them
all at start-up, on vLLM's own dummy runs::

    llm = LLM(model=..., compilation_config={..., "backend": "airstream.compat.vllm.auto_streams"})
    airstream.compat.vllm.warm_up(llm)   # every range up to max_num_batched_tokens, decided

For a config of your own, put ``backend = airstream.get_backend(config)`` in a module of yours
and name it: ``"backend": "mymodule.backend"``.

What vLLM's CPU ops mean for streams is in :mod:`airstream.graph.foreign_ops`: its kernels share one
scratch buffer per process, so no two of them run at once on different streams, and its
attention runs alone on the main stream. vLLM's AOT compile (``VLLM_USE_AOT_COMPILE``, on by
default) saves the compiled function but loads only its own backend's artifacts: with any other
backend the load fails with ``'function' object has no attribute 'finalize_loading'`` and vLLM
compiles again. Set ``VLLM_USE_AOT_COMPILE=0`` to skip the useless save.
"""

from __future__ import annotations

import importlib
from typing import Any

from airstream.backend import AirstreamBackend, get_backend
from airstream.options.config import CompilerConfig
from airstream.passes import auto_streams as _auto_streams
from airstream.passes import shared_expert_overlap
from airstream.runtime.size_ranges import one_size_per_range

__all__ = [
    "SHARED_EXPERT_MODULES",
    "all_decided",
    "auto_streams",
    "backend_named",
    "config_for",
    "one_stream",
    "shared_expert",
    "warm_up",
]

# Searched in the module paths vLLM's MoE models give their shared expert and its gate; in vLLM
# 0.32: ``layers.0.mlp.experts._shared_experts.<closure>._shared_experts._layer.gate_up_proj``.
SHARED_EXPERT_MODULES = "shared_expert"


def config_for(placement: str) -> CompilerConfig:
    """The config behind each object here: ``"one_stream"``, ``"shared_expert"``,
    ``"auto_streams"``."""
    config = CompilerConfig()
    # vLLM's ops write out= buffers and slices of them (rotary embedding, attention's output).
    # In max-autotune (the CPU default) Inductor calls them in place inside airstream's
    # segments; in reduce-overhead airstream calls them directly, not through
    # auto_functionalized_v2's copies (about 0.3 ms a call here)
    config.experimental_config.reinplace_input_mutations = True
    if placement == "shared_expert":
        config.post_grad_custom_post_pass = shared_expert_overlap(SHARED_EXPERT_MODULES)
    elif placement == "auto_streams":
        config.post_grad_custom_post_pass = _auto_streams()
    elif placement != "one_stream":
        raise ValueError(
            f"airstream.compat.vllm.config_for: placement must be 'one_stream', "
            f"'shared_expert' or 'auto_streams', got {placement!r}"
        )
    return config


one_stream: AirstreamBackend = get_backend(config_for("one_stream"))
shared_expert: AirstreamBackend = get_backend(config_for("shared_expert"))
auto_streams: AirstreamBackend = get_backend(config_for("auto_streams"))


def warm_up(llm: Any, max_tokens: int | None = None, calls: int = 256) -> list[dict[str, Any]]:
    """Take every measured decision of an engine compiled by an airstream backend before it
    serves: in each worker, vLLM's dummy runs (attention included) at one size of every size
    range from 1 to ``max_tokens`` tokens (default: the engine's ``max_num_batched_tokens``),
    each repeated until every graph has decided there (at most ``calls`` runs a size). Returns,
    per worker, the sizes run and each graph's decisions (``measurements.describe()``).
    Costs ``4 x measure_calls`` dummy runs a range (32 by default); a backend that measures
    nothing (``one_stream``) returns at once."""
    return list(llm.collective_rpc(_warm_up_worker, args=(max_tokens, calls)))


def backend_named(name: str) -> AirstreamBackend | None:
    """The airstream backend object a ``compilation_config.backend`` names, or None."""
    module, _, attribute = str(name).rpartition(".")
    if not module:
        return None
    try:
        found = getattr(importlib.import_module(module), attribute, None)
    except ImportError:
        return None
    return found if isinstance(found, AirstreamBackend) else None


def all_decided(backend: AirstreamBackend) -> bool:
    """Has every graph ``backend`` compiled decided in every size range called so far?"""
    return all(g.measurements is None or g.measurements.decided for g in backend.graphs)


def _warm_up_worker(worker: Any, max_tokens: int | None, calls: int) -> dict[str, Any]:
    """:func:`warm_up` in one vLLM worker (``worker``: vLLM's, handed by ``collective_rpc``)."""
    config = worker.vllm_config
    backend = backend_named(config.compilation_config.backend)
    if backend is None:
        raise ValueError(
            "airstream.compat.vllm.warm_up: the engine's compilation_config.backend "
            f"({config.compilation_config.backend!r}) is no airstream backend; name one, such "
            "as 'airstream.compat.vllm.auto_streams'"
        )
    top = max_tokens or config.scheduler_config.max_num_batched_tokens
    bounds = backend.config.stream_config.measure_ranges
    sizes = one_size_per_range(None if bounds == "pow2" else bounds, top)
    runner = worker.model_runner
    for size in sizes:
        for _ in range(calls):
            runner._dummy_run(size, force_attention=True)
            if all_decided(backend):
                break
    measured = {
        f"{i} {g.kind}": g.measurements.describe()
        for i, g in enumerate(backend.graphs)
        if g.measurements is not None
    }
    return {"sizes": sizes, "decisions": measured}
