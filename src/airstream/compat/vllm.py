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

For a config of your own, put ``backend = airstream.get_backend(config)`` in a module of yours
and name it: ``"backend": "mymodule.backend"``.

What vLLM's CPU ops mean for streams is in :mod:`airstream.foreign_ops`: its kernels share one
scratch buffer per process, so no two of them run at once on different streams, and its
attention runs alone on the main stream. vLLM's AOT compile (``VLLM_USE_AOT_COMPILE``, on by
default) saves the compiled function but loads only its own backend's artifacts: with any other
backend the load fails with ``'function' object has no attribute 'finalize_loading'`` and vLLM
compiles again. Set ``VLLM_USE_AOT_COMPILE=0`` to skip the useless save.
"""

from __future__ import annotations

from airstream.backend import AirstreamBackend, get_backend
from airstream.config import CompilerConfig
from airstream.passes import auto_streams as _auto_streams
from airstream.passes import shared_expert_overlap

__all__ = ["SHARED_EXPERT_MODULES", "auto_streams", "config_for", "one_stream", "shared_expert"]

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
