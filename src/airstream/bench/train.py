"""``airstream bench train``: training steps of the decode benchmark's transformers models.

The models are ``airstream bench decode``'s (``bench/decode.py``), with fewer layers (a training
step compiles a forward and a backward graph, and auto_streams measures each). A timed call is
one training step: the gradients set to None, the causal-LM loss of B sequences of L tokens
(the inputs as labels), and its backward; no optimizer step, so every step sees the same
weights. Runners, each with ``torch.compile(model.forward, ...)`` of its own, timed interleaved,
medians:

- ``eager``; ``inductor`` (``torch.compile`` defaults);
- ``airstream`` (one stream, the default mode);
- ``auto_streams`` (the forward and the backward each measured against one stream over their
  first calls, ``stream_config.measure_placement``); ``auto_streams predicted`` (the cost
  table's placement, not measured).

Every runner's loss and gradients are checked against eager's first, and the measured runner
runs until both its graphs decided before the timing starts (what a long training run is in
after its first steps). Compile time (the first step, from the ``torch.compile`` call on) is
reported apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from airstream.bench.decode import DECODE_MODELS, PREDICTED, measure_until_decided
from airstream.bench.timing import interleaved_medians, run_conditions
from airstream.bench.verdict import never_slower, never_slower_line
from airstream.graph.nodes import AUTO_STREAMS_KEY

__all__ = ["TRAIN_MODELS", "format_train", "run_train"]

TRAIN_MODELS = tuple(DECODE_MODELS)
_LAYERS = 2  # each layer is compiled into the forward and the backward graph


def _model(name: str) -> Any:
    """``bench decode``'s model ``name`` with ``_LAYERS`` layers, random weights (seed 0), in
    training mode (its dropout is 0)."""
    import transformers

    config_class, model_class, options, _ = DECODE_MODELS[name]
    config = getattr(transformers, config_class)(**{**options, "num_hidden_layers": _LAYERS})
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config).train()


def _backends(inductor: bool) -> dict[str, Any]:
    import airstream
    from airstream import passes
    from airstream.torch_internals import compile_fx

    def backend(graph_pass: Any = None, measure: Any = "auto") -> Any:
        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = graph_pass
        config.stream_config.measure_placement = measure
        return airstream.get_backend(compiler_config=config)

    runners: dict[str, Any] = {"eager": None}
    if inductor:
        runners["inductor"] = compile_fx
    runners["airstream"] = backend()
    runners["auto_streams"] = backend(passes.auto_streams())
    runners[PREDICTED] = backend(passes.auto_streams(), measure=False)
    return runners


def train_step(
    model: Any, backend: Any, batch: int, length: int
) -> tuple[Callable[[], torch.Tensor], float]:
    """One runner's training step (``torch.compile(model.forward, backend=backend)``; eager
    when ``backend`` is None), returning the loss, and the seconds its first call took from the
    ``torch.compile`` call on."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)
    start = time.perf_counter()
    forward = model.forward if backend is None else torch.compile(model.forward, backend=backend)

    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        loss = forward(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach()

    step()
    return step, time.perf_counter() - start


def _gradients(model: Any) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def run_train(
    models: tuple[str, ...] = TRAIN_MODELS,
    batch: int = 2,
    length: int = 32,
    rounds: int = 15,
    calls: int = 3,
    inductor: bool = True,
) -> dict[str, Any]:
    """Per model: each runner's median training-step seconds and compile seconds."""
    report: dict[str, Any] = {
        **run_conditions(rounds, calls, "cpu"),
        "batch": batch,
        "length": length,
        "layers": _LAYERS,
        "models": {},
        "never_slower": {},
    }
    for name in models:
        model = _model(name)
        torch.compiler.reset()
        steps: dict[str, Callable[[], torch.Tensor]] = {}
        compile_seconds: dict[str, float] = {}
        backends = _backends(inductor)
        for runner, backend in backends.items():
            steps[runner], compile_seconds[runner] = train_step(model, backend, batch, length)
        want_loss = steps["eager"]()
        want_grads = _gradients(model)
        for runner, step in steps.items():
            torch.testing.assert_close(step(), want_loss, rtol=1e-3, atol=1e-3, msg=runner)
            for got, want in zip(_gradients(model), want_grads, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-3, msg=runner)
        measured = measure_until_decided(backends["auto_streams"], steps["auto_streams"])
        medians = interleaved_medians(steps, rounds=rounds, calls_per_round=calls, warmup=2)
        figures: dict[str, Any] = {
            runner: {
                "step_ms": medians[runner] * 1e3,
                "compile_s": compile_seconds[runner] if runner != "eager" else 0.0,
            }
            for runner in steps
        }
        figures["auto_streams"]["measured"] = measured
        decisions = [
            str(g.graph_module.meta[AUTO_STREAMS_KEY])
            for g in backends[PREDICTED].graphs
            if g.graph_module.meta.get(AUTO_STREAMS_KEY) is not None
        ]
        figures[PREDICTED]["decisions"] = decisions
        report["models"][name] = figures
        report["never_slower"][name] = never_slower(
            {r: f["step_ms"] for r, f in figures.items()},
            configs=[r for r in steps if r not in ("eager", "inductor")],
            baselines=("eager", "inductor"),
        )
        del steps
    return report


def format_train(report: dict[str, Any]) -> str:
    """The report as text: per model, each runner's step against one stream's."""
    lines = [
        f"train: B={report['batch']} sequences of {report['length']} tokens, "
        f"{report['layers']} layers, loss and backward per step; medians of "
        f"{report['rounds']} interleaved rounds x {report['calls_per_round']} steps; torch "
        f"{report['torch']}, {report['device']}, {report['cores']} cores"
    ]
    for name, runners in report["models"].items():
        one = runners["airstream"]["step_ms"]
        lines.append(f"  {name}:")
        for runner, figures in runners.items():
            compiled = f"  compile {figures['compile_s']:.1f} s" if figures["compile_s"] else ""
            lines.append(
                f"    {runner:<22} {figures['step_ms']:8.2f} ms/step  "
                f"{one / figures['step_ms']:5.2f}x of one stream{compiled}"
            )
        measured = runners["auto_streams"].get("measured")
        if measured:
            lines.append(f"    auto_streams measured: {measured}")
        for decision in runners[PREDICTED].get("decisions", []):
            lines.append(f"    auto_streams' table: {decision}")
        verdict = report["never_slower"].get(name)
        if verdict is not None:
            lines.append(
                "    "
                + never_slower_line(
                    verdict, "runners interleaved in one process, warm, medians; no hand ceiling"
                )
            )
    return "\n".join(lines)
