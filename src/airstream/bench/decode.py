"""``airstream bench decode``: decode steps of real transformers architectures, as serving does it.

Each model is a transformers architecture at CPU-realistic size with random weights: a
Qwen2-MoE-style model (routed experts plus a shared expert), a DeepSeek-V3-style one (MLA
attention, routed experts plus a shared expert) and a dense Llama-style one. Serving code
compiles ``model.forward`` and calls it once per generated token with a static KV cache; here each
runner gets its own ``StaticCache``, filled by one eager prefill of the prompt, and its own
compiled forward. A timed call is one decode step: B sequences, one new token each, written at
the same cache position every time (the cache's length is set back to the prompt's before each
step; a static cache attends over its whole length, so every step costs the same). Runners,
timed interleaved, medians:

- ``eager``; ``inductor`` (``torch.compile`` defaults);
- ``airstream`` (one stream, the default mode: max-autotune on CPU, reduce-overhead on CUDA;
  ``airstream.graph.mode``) and ``airstream <the other mode>``; ``auto_streams``; ``shared_expert``
  (``shared_expert_overlap``, MoE models with a shared expert), both in the default mode;
- ``alt_stream`` (MoE models with a shared expert): the same weights with each MoE block
  written as serving stacks write it, the shared expert under ``with alt_stream:`` and
  ``wait_stream`` before and after (``selftest/alt_stream.py``), compiled with no pass: PyTorch's
  own stream IR on airstream's streams. The report compares it with one stream.

Every runner's logits are checked against eager's first. Compile time (the first compiled call)
is reported apart. Tokens/s = B / step time.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import torch

from airstream.bench.timing import (
    cuda_graphs,
    interleaved_medians,
    run_conditions,
    synchronized,
)
from airstream.bench.verdict import never_slower, never_slower_line
from airstream.graph.nodes import AUTO_STREAMS_KEY

__all__ = ["DECODE_MODELS", "build_model", "decode_step", "format_decode", "run_decode"]

_ATTENTION = {"num_hidden_layers": 4, "num_attention_heads": 16, "max_position_embeddings": 256}

DECODE_MODELS: dict[str, tuple[str, str, dict[str, Any], str | None]] = {
    # name: (config class, model class, options, shared-expert module regex)
    "qwen2-moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **_ATTENTION,
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 2816,
            "num_key_value_heads": 8,
            "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 2816,
            "num_experts": 16,
            "num_experts_per_tok": 4,
        },
        r"shared_expert\b",
    ),
    "deepseek-v3": (
        "DeepseekV3Config",
        "DeepseekV3ForCausalLM",
        {
            **_ATTENTION,
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 2816,
            "num_key_value_heads": 16,
            "moe_intermediate_size": 704,
            "n_routed_experts": 16,
            "num_experts_per_tok": 4,
            "n_shared_experts": 2,
            "first_k_dense_replace": 1,
            "q_lora_rank": 384,
            "kv_lora_rank": 256,
            "qk_rope_head_dim": 32,
            "qk_nope_head_dim": 64,
            "v_head_dim": 64,
            "n_group": 1,
            "topk_group": 1,
        },
        r"shared_experts\b",
    ),
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            **_ATTENTION,
            "vocab_size": 2048,
            "hidden_size": 1024,
            "intermediate_size": 2816,
            "num_key_value_heads": 8,
        },
        None,
    ),
}


def build_model(name: str, device: str = "cpu") -> tuple[Any, str | None]:
    """The ``DECODE_MODELS`` model ``name`` with random weights (seed 0), in eval mode, and the
    regex naming its shared expert (``None`` if it has none)."""
    import transformers

    config_class, model_class, options, shared = DECODE_MODELS[name]
    config = getattr(transformers, config_class)(**options)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).eval().to(device)
    return model, shared


def _backends(shared: str | None, inductor: bool, device: str) -> dict[str, Any]:
    import airstream
    from airstream import passes
    from airstream.graph.mode import MODES, resolve_mode
    from airstream.torch_internals import compile_fx

    def config(mode: str = "default", graph_pass: Any = None, measure: Any = "auto") -> Any:
        out = airstream.CompilerConfig()
        out.mode = mode
        out.post_grad_custom_pre_pass = graph_pass
        out.stream_config.measure_placement = measure
        return airstream.get_backend(compiler_config=out)

    default = resolve_mode(airstream.CompilerConfig(), torch.device(device).type)
    other = next(m for m in MODES if m != default)
    runners: dict[str, Any] = {"eager": None}
    if inductor:
        runners["inductor"] = compile_fx
    runners["airstream"] = config()
    runners[f"airstream {other}"] = config(other)
    runners["auto_streams"] = config(graph_pass=passes.auto_streams())  # measured on CPU
    if not device.startswith("cuda"):  # measure_placement measures CPU graphs
        runners[PREDICTED] = config(graph_pass=passes.auto_streams(), measure=False)
    if shared is not None:
        runners["shared_expert"] = config(graph_pass=passes.shared_expert_overlap(shared=shared))
    return runners


# auto_streams with stream_config.measure_placement off: the cost table's decision alone
PREDICTED = "auto_streams predicted"


def measure_until_decided(backend: Any, step: Callable[[], torch.Tensor] | None) -> str:
    """Run the measured runner's first calls until each graph has decided (what a serving
    process does before its steady state, which the timing then sees); its decisions."""
    if backend is None or step is None:
        return ""
    for calls in range(64):
        measured = [g.measurements for g in backend.graphs if g.measurements is not None]
        if calls > 0 and all(m.decided for m in measured):
            return "; ".join(m.describe() for m in measured) or "nothing to measure"
        step()
    raise RuntimeError("measure_placement did not decide within 64 calls")


def _plain_backend() -> Any:
    import airstream

    return airstream.get_backend(compiler_config=airstream.CompilerConfig())


def _alt_stream_model(name: str, device: str) -> Any:
    """Model ``name`` again (the same weights), each MoE block's shared expert on one stream."""
    from airstream.selftest.alt_stream import use_alt_stream

    model, _ = build_model(name, device)
    stream = torch.cuda.Stream() if device.startswith("cuda") else torch.Stream(device="cpu")
    use_alt_stream(model, stream)
    return model


def decode_step(
    model: Any,
    backend: Any,
    batch: int,
    prompt: int,
    max_len: int,
    forward: Callable[..., Any] | None = None,
) -> tuple[Callable[[], torch.Tensor], float]:
    """One runner: its cache filled by an eager prefill, and a function doing one decode step
    with ``torch.compile(model.forward, backend=backend)`` (``forward`` instead when given;
    eager when both are None). Returns the step and the seconds its first call took, from the
    ``torch.compile`` call on."""
    import transformers

    cache: Any = transformers.StaticCache(config=model.config, max_cache_len=max_len)
    # transformers renamed past_key_values to cache (5.24 warns on the old name)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    device = model.device
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), generator=generator)
    ids = ids.to(device)
    with torch.no_grad():
        model(input_ids=ids, **{name: cache}, use_cache=True)
    token = torch.randint(0, model.config.vocab_size, (batch, 1), generator=generator).to(device)
    position = torch.tensor([prompt], device=device)
    # the first call's time starts at torch.compile: torch.compile(backend="inductor") imports
    # Inductor there (0.7 s here), which a backend object's compile does at its first call
    start = time.perf_counter()
    if forward is None and backend is not None:
        forward = torch.compile(model.forward, backend=backend)
    elif forward is None:
        forward = model.forward

    lengths = [layer.cumulative_length for layer in cache.layers]

    def step() -> torch.Tensor:
        with torch.no_grad():
            for length in lengths:  # back to the prompt: every step writes the same position
                length.fill_(prompt)
            out = forward(input_ids=token, **{name: cache}, cache_position=position, use_cache=True)
        return out.logits

    timed = synchronized(str(device), step)
    timed()
    return timed, time.perf_counter() - start


def run_decode(
    models: tuple[str, ...] = tuple(DECODE_MODELS),
    batch: int = 4,
    prompt: int = 32,
    rounds: int = 15,
    calls: int = 3,
    inductor: bool = True,
    device: str = "cpu",
) -> dict[str, Any]:
    """Per model: each runner's median decode-step seconds, tokens/s and compile seconds (on a
    CUDA ``device``, each step ends with a synchronize)."""
    report: dict[str, Any] = {
        **run_conditions(rounds, calls, device),
        "batch": batch,
        "prompt": prompt,
        "models": {},
    }
    for name in models:
        model, shared = build_model(name, device)
        torch.compiler.reset()
        steps: dict[str, Callable[[], torch.Tensor]] = {}
        compile_seconds: dict[str, float] = {}
        backends = _backends(shared, inductor, device)
        for runner, backend in backends.items():
            steps[runner], compile_seconds[runner] = decode_step(
                model, backend, batch, prompt, prompt + 8
            )
        if shared is not None:  # the shared expert on a torch.Stream in the model's own code
            steps["alt_stream"], compile_seconds["alt_stream"] = decode_step(
                _alt_stream_model(name, device), _plain_backend(), batch, prompt, prompt + 8
            )
        decisions = [
            g.graph_module.meta.get(AUTO_STREAMS_KEY)
            for g in getattr(backends["auto_streams"], "graphs", [])
        ]
        want = steps["eager"]()
        for runner, step in steps.items():
            torch.testing.assert_close(step(), want, rtol=1e-3, atol=1e-3, msg=runner)
        measured = measure_until_decided(backends.get("auto_streams"), steps.get("auto_streams"))
        medians = interleaved_medians(steps, rounds=rounds, calls_per_round=calls, warmup=2)
        report["models"][name] = {
            runner: {
                "step_ms": medians[runner] * 1e3,
                "tokens_per_s": batch / medians[runner],
                "compile_s": compile_seconds[runner] if runner != "eager" else 0.0,
            }
            for runner in steps
        }
        report["never_slower"] = report.get("never_slower", {})
        report["never_slower"][name] = never_slower(
            {r: f["step_ms"] for r, f in report["models"][name].items()},
            configs=[r for r in steps if r not in ("eager", "inductor")],
            baselines=("eager", "inductor"),
        )
        if measured:
            report["models"][name]["auto_streams"]["measured"] = measured
        for runner, statuses in cuda_graphs(backends).items():
            report["models"][name][runner]["cuda_graphs"] = statuses
        decision = next((d for d in decisions if d is not None), None)
        if decision is not None:
            report["models"][name]["auto_streams"]["decision"] = str(decision)
            report["models"][name]["auto_streams"]["predicted_gain"] = (
                decision.predicted_gain if decision.applied else 1.0
            )
        del steps
    return report


def format_decode(report: dict[str, Any]) -> str:
    """The report as text: per model, each runner against the best of eager and Inductor."""
    lines = [
        f"decode: B={report['batch']} sequences, one token each per step, prompt "
        f"{report['prompt']}, static KV cache; medians of {report['rounds']} interleaved rounds "
        f"x {report['calls_per_round']} steps; torch {report['torch']}, {report['device']}, "
        f"{report['cores']} cores"
    ]
    for name, runners in report["models"].items():
        baseline = min(runners[r]["step_ms"] for r in ("eager", "inductor") if r in runners)
        lines.append(f"  {name}:")
        for runner, figures in runners.items():
            compiled = f"  compile {figures['compile_s']:.1f} s" if figures["compile_s"] else ""
            lines.append(
                f"    {runner:<22} {figures['step_ms']:8.2f} ms/step "
                f"{figures['tokens_per_s']:8.1f} tok/s  {baseline / figures['step_ms']:5.2f}x"
                f"{compiled}"
            )
        if "alt_stream" in runners:
            measured = runners["airstream"]["step_ms"] / runners["alt_stream"]["step_ms"]
            lines.append(
                f"    alt_stream (torch.Stream in the model's code, no pass) {measured:.2f}x "
                "over one stream"
            )
        auto = runners.get("auto_streams", {})
        if "measured" in auto:
            lines.append(f"    auto_streams measured its placement: {auto['measured']}")
        if "decision" in auto:
            unmeasured = runners.get(PREDICTED, auto)
            measured = runners["airstream"]["step_ms"] / unmeasured["step_ms"]
            lines.append(
                f"    auto_streams predicted {auto['predicted_gain']:.2f}x over one stream, "
                f"ran {measured:.2f}x as placed; {auto['decision']}"
            )
        verdict = report.get("never_slower", {}).get(name)
        if verdict is not None:
            lines.append(
                "    "
                + never_slower_line(
                    verdict, "runners interleaved in one process, warm, medians; no hand ceiling"
                )
            )
    lines.append("  (x: tokens/s over the best of eager and inductor)")
    return "\n".join(lines)
