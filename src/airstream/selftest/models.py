"""Real model code as the test bed: transformers architectures through every airstream config.

Each architecture is built from a small config with random weights (no hub access), in eval mode
with dropout off. Each case compiles it with airstream in one configuration, runs it, and compares
with eager; a case that does not match is run again under torch's ``aot_eager`` and classified:
``pass``, ``aot_eager too`` (it also fails without airstream, under ``aot_eager``: a torch or
transformers limit, not ours; the detail says what differed) or ``FAIL`` (airstream's own).
Every case counts the Dynamo graphs compiled by its first call (1 + graph breaks) and by later
calls (recompiles), next to ``aot_eager``'s counts for the same calls, so a pass that pins a
shape shows as extra recompiles.

A configuration is a placement run one way. Placements: none; ``auto_streams`` (as it decides
on this machine); ``auto_forced`` (``auto_streams(max_streams=3, min_gain=0)`` on nominal costs:
every role and list schedule it finds goes onto side streams, the same on every machine);
``forced`` (every third op on a side stream: the planner's syncs on real graphs);
``shared_expert`` and ``moe_experts`` where the model has those modules. Runs: inference at one
length (the configuration is named by its placement, ``default`` for none); ``training``
(forward and backward, gradients compared); ``two_lengths`` (a second sequence length: dynamic
shapes); ``generate`` (greedy decoding with the KV cache, ``model.forward`` compiled the way
serving code does it: tokens compared). A run with a placement is named ``run/placement``
(``training/auto_forced``). Every case compiles in the mode given (``default``: what a user gets,
Inductor segments on CPU).

``airstream selftest models`` runs them all and prints a table; the test suite runs a subset.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import airstream
from airstream import passes
from airstream.ops.library import is_air_op
from airstream.selftest.architectures import ARCHS, VOCAB, Arch

__all__ = [
    "ARCHS",
    "CONFIGS",
    "MODES",
    "PLACEMENTS",
    "RUNS",
    "Arch",
    "CaseResult",
    "config_name",
    "format_table",
    "parse_config",
    "run_case",
    "run_suite",
]

LENGTHS = (12, 20)
RTOL, ATOL = 1e-4, 1e-5

PLACEMENTS = ("none", "auto_streams", "auto_forced", "forced", "shared_expert", "moe_experts")
RUNS = ("inference", "two_lengths", "training", "generate")


def config_name(run: str, placement: str) -> str:
    """The name of ``placement`` run as ``run`` (``default``, ``training/auto_forced``)."""
    if run == "inference":
        return "default" if placement == "none" else placement
    return run if placement == "none" else f"{run}/{placement}"


def parse_config(name: str) -> tuple[str, str]:
    """(run, placement) of a configuration name."""
    run, _, placement = name.rpartition("/")
    if not run:
        run, placement = ("inference", name) if name in PLACEMENTS else (name, "none")
    if name == "default":
        run, placement = "inference", "none"
    if run not in RUNS or placement not in PLACEMENTS or config_name(run, placement) != name:
        raise ValueError(f"unknown configuration {name!r}")
    return run, placement


CONFIGS = (
    *(config_name("inference", p) for p in PLACEMENTS),
    *(config_name(run, p) for run in RUNS[1:] for p in ("none", "auto_streams", "auto_forced")),
)
MODES = ("default", "reduce-overhead", "max-autotune")


@dataclasses.dataclass
class CaseResult:
    """One architecture in one configuration."""

    arch: str
    config: str
    status: str  # "pass", "aot_eager too", "FAIL", "n/a"
    mode: str = ""  # the mode its graphs compiled in (the one asked for, or default's choice)
    max_diff: float = 0.0
    graphs: int = 0  # Dynamo graphs compiled by the first call (1 + graph breaks)
    recompiles: int = 0  # Dynamo graphs compiled by later calls
    reference_graphs: int = 0  # the same two counts under aot_eager
    reference_recompiles: int = 0
    side_streams: int = 0  # most side streams in one of its compiled graphs
    fallbacks: int = 0  # max-autotune segments that ran as aten code (Inductor failed)
    seconds: float = 0.0
    detail: str = ""

    @property
    def extra_recompiles(self) -> int:
        """Recompiles airstream added over aot_eager's."""
        return max(0, self.recompiles - self.reference_recompiles)


def applies(arch: Arch, config: str) -> bool:
    """Whether ``config`` means something for ``arch``."""
    run, placement = parse_config(config)
    if placement == "shared_expert" and arch.shared_expert is None:
        return False
    if placement == "moe_experts" and not arch.experts:
        return False
    return run != "generate" or arch.family in ("causal", "seq2seq")


def _every_third_op_on_a_side_stream(gm: torch.fx.GraphModule, inputs: Any, config: Any) -> None:
    # the model's own stream ops (qwen2_moe_alt's wait_stream, as air ops) keep their streams
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and not is_air_op(n.target)]
    passes.place_on_stream(gm, calls[1::3], "side")


def airstream_config(arch: Arch, config: str, mode: str = "default") -> airstream.CompilerConfig:
    """The CompilerConfig of a case."""
    _, placement = parse_config(config)
    out = airstream.CompilerConfig()
    out.mode = mode
    if placement == "auto_streams":
        out.post_grad_custom_pre_pass = passes.auto_streams()
    elif placement == "auto_forced":
        out.post_grad_custom_pre_pass = passes.auto_streams(
            max_streams=3, min_gain=0, costs="nominal"
        )
        out.stream_config.measure_placement = False  # forced: every call runs the streams
    elif placement == "forced":
        out.post_grad_custom_pre_pass = _every_third_op_on_a_side_stream
    elif placement == "shared_expert":
        out.post_grad_custom_pre_pass = passes.shared_expert_overlap(
            shared=arch.shared_expert or "shared_expert"
        )
    elif placement == "moe_experts":
        out.post_grad_custom_pre_pass = passes.moe_experts()
    return out


class _Counting:
    """A Dynamo backend that counts the graphs it is given."""

    def __init__(self, backend: Callable[..., Any]) -> None:
        self.backend = backend
        self.count = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        self.count += 1
        return self.backend(gm, example_inputs)


def _ids(length: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, length), generator=generator)


def _inputs(arch: Arch, length: int) -> dict[str, torch.Tensor]:
    ids = _ids(length)
    if arch.family == "seq2seq":
        return {"input_ids": ids, "decoder_input_ids": ids[:, : max(2, length // 3)]}
    return {"input_ids": ids}


def _main_output(out: Any) -> torch.Tensor:
    for name in ("logits", "last_hidden_state"):
        value = getattr(out, name, None)
        if isinstance(value, torch.Tensor):
            return value
    raise TypeError(f"no logits or last_hidden_state in {type(out).__name__}")


def _loss(out: Any) -> torch.Tensor:
    """A loss every floating output takes part in (BERT's pooler too: an output no loss reads
    gets a zero gradient compiled and none in eager, torch's own difference, not a stream's)."""
    values = out.values() if hasattr(out, "values") else [_main_output(out)]
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return torch.stack([t.float().square().mean() for t in tensors]).sum()


def _diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max()) if got.numel() else 0.0


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return got.shape == want.shape and torch.allclose(got, want, rtol=RTOL, atol=ATOL)


@dataclasses.dataclass
class _Outcome:
    ok: bool  # matched eager
    worst: float  # largest difference (generate: tokens that differ)
    first: int  # graphs compiled by the first call
    later: int  # graphs compiled by later calls
    why: str = ""  # what differed, when it is not a number


def _run(arch: Arch, run: str, backend: Callable[..., Any], streams: bool = True) -> _Outcome:
    """Run one case (``run``: one of RUNS) with ``backend`` and compare with eager
    (``streams=False``: a model with streams in its code runs without them, as torch's own
    backends must on CPU)."""
    model = arch.build(streams=streams)
    counting = _Counting(backend)
    if run == "generate":
        return _run_generate(arch, model, counting)
    if run == "training":
        return _run_training(arch, model, counting)
    compiled = torch.compile(model, backend=counting)
    lengths = LENGTHS if run == "two_lengths" else LENGTHS[:1]
    ok, worst, first = True, 0.0, 0
    with torch.no_grad():
        for i, length in enumerate(lengths):
            inputs = _inputs(arch, length)
            want = _main_output(model(**inputs))
            got = _main_output(compiled(**inputs))
            if i == 0:
                first = counting.count
            ok = ok and _close(got, want)
            worst = max(worst, _diff(got, want))
    return _Outcome(ok, worst, first, counting.count - first)


def _run_training(arch: Arch, model: torch.nn.Module, counting: _Counting) -> Any:
    reference = arch.build()
    model.train()
    reference.train()
    compiled = torch.compile(model, backend=counting)
    inputs = _inputs(arch, LENGTHS[0])
    _loss(compiled(**inputs)).backward()
    _loss(reference(**inputs)).backward()
    ok, worst, why = True, 0.0, ""
    pairs = zip(model.named_parameters(), reference.parameters(), strict=True)
    for (name, got), want in pairs:
        if got.grad is None or want.grad is None:
            if (got.grad is None) != (want.grad is None):
                ok = False
                mine, theirs = ("None", "a tensor") if got.grad is None else ("a tensor", "None")
                why = why or f"{name}.grad is {mine} compiled, {theirs} in eager"
            continue
        ok = ok and _close(got.grad, want.grad)
        worst = max(worst, _diff(got.grad, want.grad))
    return _Outcome(ok, worst, counting.count, 0, why)


def _run_generate(arch: Arch, model: Any, counting: _Counting) -> Any:
    ids = _ids(LENGTHS[0])
    options = {"max_new_tokens": 6, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        want = model.generate(ids, **options)
        model.forward = torch.compile(model.forward, backend=counting)
        got = model.generate(ids, **options)
    matched = got.shape == want.shape and bool(torch.equal(got, want))
    differing = int((got != want).sum()) if got.shape == want.shape else got.numel()
    return _Outcome(matched, float(differing), counting.count, 0)


def run_case(arch: Arch, config: str, mode: str = "default") -> CaseResult:
    """Run ``arch`` in ``config``, compiled in ``mode``, with airstream and, for the graph counts
    and when it does not match, with aot_eager."""
    from airstream.torch_internals import aot_eager

    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    if not applies(arch, config):
        return CaseResult(arch.name, config, "n/a")
    run, _ = parse_config(config)
    start = time.perf_counter()
    result = CaseResult(arch.name, config, "pass")
    torch.compiler.reset()
    backend = None
    try:
        backend = airstream.get_backend(compiler_config=airstream_config(arch, config, mode))
        outcome = _run(arch, run, backend)
        ok, result.max_diff = outcome.ok, outcome.worst
        result.graphs, result.recompiles = outcome.first, outcome.later
        if not ok:
            result.detail = outcome.why or f"differs from eager by {outcome.worst:.3g}"
    except Exception as error:
        ok = False
        first_line = (str(error).splitlines() or [""])[0]
        result.detail = f"{type(error).__name__}: {first_line[:160]}"
    if backend is not None:
        result.side_streams = max((len(g.streams.side_streams) for g in backend.graphs), default=0)
        result.mode = ",".join(sorted({g.mode for g in backend.graphs}))
        result.fallbacks = sum(g.fallbacks for g in backend.graphs)
    torch.compiler.reset()
    try:
        reference = _run(
            arch,
            run,
            aot_eager,
            streams=False,  # torch's own backends cannot order CPU streams
        )
        ref_ok = reference.ok
        result.reference_graphs, result.reference_recompiles = reference.first, reference.later
    except Exception:
        ref_ok = False
    torch.compiler.reset()
    if not ok:
        result.status = "aot_eager too" if not ref_ok else "FAIL"
    result.seconds = time.perf_counter() - start
    return result


def run_suite(
    archs: Sequence[str] | None = None,
    configs: Sequence[str] | None = None,
    progress: Callable[[CaseResult], None] | None = None,
    mode: str = "default",
) -> list[CaseResult]:
    """Every architecture in every configuration (or the named ones), compiled in ``mode``."""
    unknown = sorted(set(archs or ()) - set(ARCHS)) + sorted(
        c for c in set(configs or ()) if not _known(c)
    )
    if unknown:
        raise ValueError(
            f"unknown architecture or configuration {unknown}; architectures: "
            f"{', '.join(ARCHS)}; configurations: {', '.join(CONFIGS)} (any run/placement of "
            f"runs {', '.join(RUNS[1:])} and placements {', '.join(PLACEMENTS[1:])})"
        )
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    results = []
    for name in archs or ARCHS:
        for config in configs or CONFIGS:
            result = run_case(ARCHS[name], config, mode)
            results.append(result)
            if progress is not None:
                progress(result)
    return results


def _known(config: str) -> bool:
    try:
        parse_config(config)
    except ValueError:
        return False
    return True


def format_table(results: Sequence[CaseResult]) -> str:
    """The results as a table, with a summary line."""
    header = (
        f"{'model':<13} {'config':<24} {'mode':<15} {'result':<14} {'max diff':>9} "
        f"{'sides':>5} {'aten':>4} {'graphs':>7} {'recomp':>7} {'secs':>5}  detail"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        if r.status == "n/a":
            continue
        graphs = f"{r.graphs}/{r.reference_graphs}"
        recompiles = f"{r.recompiles}/{r.reference_recompiles}"
        generate = r.config.split("/")[0] == "generate"
        diff = f"{int(r.max_diff)} tok" if generate else f"{r.max_diff:.2g}"
        lines.append(
            f"{r.arch:<13} {r.config:<24} {r.mode:<15} {r.status:<14} {diff:>9} "
            f"{r.side_streams:>5} {r.fallbacks:>4} {graphs:>7} {recompiles:>7} {r.seconds:>5.1f}"
            f"  {r.detail}"
        )
    ran = [r for r in results if r.status != "n/a"]
    passed = sum(r.status == "pass" for r in ran)
    shared = sum(r.status == "aot_eager too" for r in ran)
    failed = sum(r.status == "FAIL" for r in ran)
    extra = sum(r.extra_recompiles for r in ran)
    fallbacks = sum(r.fallbacks for r in ran)
    seconds = sum(r.seconds for r in ran)
    lines.append(
        f"{len(ran)} cases: {passed} match eager, {shared} fail under aot_eager too, "
        f"{failed} fail in airstream only; {extra} recompiles beyond aot_eager's "
        f"(graphs and recompiles: airstream/aot_eager); {fallbacks} segments ran as aten code "
        f"(aten: Inductor could not compile them); {seconds:.0f} s"
    )
    return "\n".join(lines)
