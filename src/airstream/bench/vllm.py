"""``airstream bench vllm``: a tiny Qwen2-MoE served by vLLM's CPU build, one compile backend per
engine, each engine in its own process, the engines taking turns.

Runners, each a ``vllm.LLM`` with ``compilation_config={"mode": 2, "backend": ...}``:
``inductor`` (vLLM's default on CPU), and airstream's ``one_stream``, ``shared_expert``
(``shared_expert_overlap``) and ``auto_streams`` (``airstream.compat.vllm``).

Each engine process builds its engine, warms every shape up (the compile, and ``auto_streams``'
decisions, happen there), then serves the parent's commands over a pipe, the engines in turn,
in a new order each round. A command is a batch of ``B`` prompts of 16 tokens: ``generate`` with
1 new token (the prefill), then with ``1 + steps``; the difference over ``steps`` is one decode
step of ``B`` sequences (tokens/s = ``B`` / step). The prefill row is 4 prompts of 128 tokens.
Step times are medians over the rounds; ratios, medians of the rounds' ratios. Prefix caching
is off; every runner's greedy tokens are compared with ``inductor``'s.

Conditions: vLLM's CPU defaults (OpenMP threads unbound on 2 cores); ``GOMP_SPINCOUNT=10000``
in every engine, so an idle one waiting on its pipe does not spin on a core the running one
needs; ``AIRSTREAM_DECISIONS=off`` (every run measures anew); Inductor's caches warm.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from airstream.bench.timing import paired_ratios

__all__ = ["BATCHES", "RUNNERS", "Engine", "format_vllm", "run_vllm", "save_tiny_moe"]

RUNNERS: dict[str, dict[str, Any]] = {  # each runner's compilation_config
    "inductor": {"mode": 2},
    "one stream": {"mode": 2, "backend": "airstream.compat.vllm.one_stream"},
    "shared_expert": {"mode": 2, "backend": "airstream.compat.vllm.shared_expert"},
    "auto_streams": {"mode": 2, "backend": "airstream.compat.vllm.auto_streams"},
}
BATCHES = (1, 2, 4, 8, 16, 32)
PREFILL = (4, 128)  # prompts, tokens each
_PROMPT = 16
_TAG = "AIRSTREAM-BENCH "
_INSTALL = (
    "airstream bench vllm needs vLLM's CPU build in this venv: "
    'pip install -e ".[vllm]" torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu '
    "(README: Serving with vLLM)"
)


def save_tiny_moe(folder: Path, hidden: int = 256, layers: int = 2) -> Path:
    """A Qwen2-MoE with random weights (seed 0), saved for vLLM to load: heads of 32, every
    size a multiple of 32 (vLLM's CPU MoE kernel needs it), 8 experts, top 2, a shared expert."""
    import torch
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    config = Qwen2MoeConfig(
        hidden_size=hidden,
        num_attention_heads=hidden // 32,
        num_key_value_heads=max(1, hidden // 64),
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden // 2,
        shared_expert_intermediate_size=2 * hidden,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=layers,
        vocab_size=512,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    Qwen2MoeForCausalLM(config).save_pretrained(folder)
    return folder


def engine_env() -> dict[str, str]:
    """The environment of an engine process: vLLM in-process on CPU, 1 GiB of KV cache."""
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")  # vLLM loads only its own backend's artifacts
    env.setdefault("GOMP_SPINCOUNT", "10000")
    env.setdefault("AIRSTREAM_DECISIONS", "off")  # auto_streams measures in every run
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def make_engine(model: Path, compilation: dict[str, Any]) -> Any:
    """A ``vllm.LLM`` serving ``model`` compiled as ``compilation`` says."""
    from vllm import LLM

    return LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=512,
        max_num_seqs=max(BATCHES),
        max_num_batched_tokens=PREFILL[0] * PREFILL[1],
        enable_prefix_caching=False,
        compilation_config=compilation,
        seed=0,
    )


def generate(llm: Any, batch: int, length: int, new: int, seed: int) -> list[list[int]]:
    """Greedy ``new`` tokens for ``batch`` prompts of ``length`` ids drawn from ``seed``."""
    from vllm import SamplingParams

    draw = random.Random(seed)
    prompts = [
        {"prompt_token_ids": [draw.randrange(1, 500) for _ in range(length)]} for _ in range(batch)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True, detokenize=False)
    out = llm.generate(prompts, params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in out]


LIVE = (8, 100)  # the live steps timed: sequences, steps (the first a prefill of 8 x 16)


def live_steps(llm: Any, seed: int) -> list[float]:
    """The time of each engine step (seconds) serving ``LIVE[0]`` prompts of 16 tokens for
    ``LIVE[1]`` new tokens each: a prefill step, then decode steps, as a server's first
    requests meet them."""
    from vllm import SamplingParams

    sequences, steps = LIVE
    draw = random.Random(seed)
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, detokenize=False)
    engine = llm.llm_engine
    for i in range(sequences):
        prompt = {"prompt_token_ids": [draw.randrange(1, 500) for _ in range(_PROMPT)]}
        engine.add_request(f"live-{seed}-{i}", prompt, params)
    times = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times[:steps]


def _timed(llm: Any, command: dict[str, Any]) -> dict[str, Any]:
    batch, length, steps, seed = (command[k] for k in ("batch", "length", "steps", "seed"))
    start = time.perf_counter()
    generate(llm, batch, length, 1, seed)
    first, start = time.perf_counter() - start, time.perf_counter()
    tokens = generate(llm, batch, length, 1 + steps, seed) if steps else []
    return {"first_s": first, "whole_s": time.perf_counter() - start, "tokens": tokens}


def side_stream_ops(graph: Any) -> dict[str, dict[str, int]]:
    """Per side stream of a compiled graph: how many nodes of each op run there (a fused
    segment's members counted by their own op)."""
    nodes = {n.name: n for n in graph.graph_module.graph.nodes}
    members = {s.node: s.segment for s in graph.segments if s.node is not None}
    out: dict[str, dict[str, int]] = {}
    for label in (s for s in graph.streams.streams if s):
        counts: dict[str, int] = {}
        for name in graph.streams.nodes_on(label):
            for node in getattr(members.get(name), "members", None) or [nodes[name]]:
                if node.target is operator.getitem:
                    continue
                key = op_label(node)
                counts[key] = counts.get(key, 0) + 1
        out[str(label)] = counts
    return out


def op_label(node: Any) -> str:
    """A node's op as a report names it: ``aten.mm.default``; a custom op reached through
    ``auto_functionalized`` by the op it wraps (``_C.onednn_mm.default``)."""
    from airstream.torch_internals import OpOverload

    wrapped = [a for a in node.args if isinstance(a, OpOverload)]
    return str(wrapped[0] if wrapped else node.target)


def _placements(compilation: dict[str, Any]) -> list[dict[str, Any]]:
    """Per graph an airstream runner compiled: its side streams' ops and what was measured."""
    from airstream.compat.vllm import backend_named

    compiled = backend_named(str(compilation.get("backend", "")))
    if compiled is None:  # Inductor's
        return []
    return [
        {
            "kind": graph.kind,
            "side_streams": side_stream_ops(graph),
            "measured": None if graph.measurements is None else graph.measurements.describe(),
            "code": hashlib.sha1(graph.executor.code.encode()).hexdigest()[:12],
        }
        for graph in compiled.graphs
    ]


def _engine(model: str, compilation: str, steps: int, warm: int) -> None:
    """An engine process: build, warm up, then answer the parent's commands (one JSON per line)."""
    from airstream.compat.vllm import all_decided, backend_named, warm_up

    config = json.loads(compilation)
    llm = make_engine(Path(model), config)
    started: dict[str, Any] = {}
    compiled = backend_named(str(config.get("backend", "")))
    if compiled is not None:  # measured at start-up, as a server would
        begin = time.perf_counter()
        started["warm_up"] = warm_up(llm)
        started["warm_up_s"] = time.perf_counter() - begin
    started["first_live_s"] = live_steps(llm, seed=-1)  # a server's first requests
    shapes = [(b, _PROMPT, 1 + steps) for b in BATCHES] + [(*PREFILL, 2)]
    for batch, length, new in shapes:
        for seed in range(warm):  # the compile, then auto_streams' measured calls in each range
            generate(llm, batch, length, new, seed)
        # until every size range called has decided: a decode command's prefill of B x 16
        # tokens hits its range once a call, and a decision takes 8 timed calls of each of two
        for seed in range(warm, warm + 48):
            if compiled is None or all_decided(compiled):
                break
            generate(llm, batch, length, new, seed)
    ready = {"ready": True, "placements": _placements(config), **started}
    print(_TAG + json.dumps(ready), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("stop"):
            break
        if command.get("report"):  # the placements as they stand now, measured ranges included
            print(_TAG + json.dumps({"placements": _placements(config)}), flush=True)
            continue
        if command.get("live"):  # the live steps again, in the steady state
            print(_TAG + json.dumps({"live_s": live_steps(llm, command["seed"])}), flush=True)
            continue
        print(_TAG + json.dumps(_timed(llm, command)), flush=True)


class Engine:
    """A vLLM engine in a process of its own, serving ``model`` compiled as ``compilation``
    says, warmed up at every shape ``warm`` times; :meth:`ask` runs a command there."""

    def __init__(
        self, model: Path, compilation: dict[str, Any], steps: int, warm: int, log: Path
    ) -> None:
        self.log = log.open("w")
        argv = ["-m", "airstream.bench.vllm", str(model), json.dumps(compilation)]
        self.process = subprocess.Popen(
            [sys.executable, *argv, str(steps), str(warm)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=engine_env(),
        )
        self.ready = self.reply()

    def reply(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(_TAG):
                return dict(json.loads(line[len(_TAG) :]))
        raise RuntimeError(f"a vLLM engine exited early; its log: {self.log.name}")

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self.reply()

    def stop(self) -> None:
        if self.process.poll() is None and self.process.stdin is not None:
            self.process.stdin.write(json.dumps({"stop": True}) + "\n")
            self.process.stdin.close()
        self.process.wait(timeout=60)
        self.log.close()


def run_vllm(rounds: int, steps: int, hidden: int, layers: int) -> dict[str, Any]:
    """Every runner at every batch size and the prefill, ``rounds`` interleaved rounds."""
    try:
        import vllm
    except ImportError:
        print(_INSTALL, file=sys.stderr)
        raise SystemExit(2) from None
    work = Path(tempfile.mkdtemp(prefix="airstream-bench-vllm-"))
    model = save_tiny_moe(work / "model", hidden, layers)
    engines = {}
    try:
        for name, compilation in RUNNERS.items():  # one at a time: compiles share no cores
            log = work / f"{name.replace(' ', '_')}.log"
            engines[name] = Engine(model, compilation, steps, 3, log)
        shapes = [("decode", b, _PROMPT, steps) for b in BATCHES] + [("prefill", *PREFILL, 0)]
        times: dict[str, dict[str, list[float]]] = {}
        same: dict[str, dict[str, bool]] = {}
        order = list(engines)
        for r in range(rounds):
            random.Random(r).shuffle(order)
            for kind, batch, length, n in shapes:
                key = f"{kind} {batch}"
                command = {"batch": batch, "length": length, "steps": n, "seed": 100 + r}
                answers = {name: engines[name].ask(command) for name in order}
                for name, got in answers.items():
                    step = (got["whole_s"] - got["first_s"]) / n if n else got["first_s"]
                    times.setdefault(key, {}).setdefault(name, []).append(step)
                    equal = got["tokens"] == answers["inductor"]["tokens"]
                    same.setdefault(key, {}).setdefault(name, True)
                    same[key][name] = same[key][name] and equal
        steady = {n: engines[n].ask({"live": True, "seed": -1})["live_s"] for n in order}
        placements = {n: e.ask({"report": True})["placements"] for n, e in engines.items()}
        live = {
            name: {
                "first": _percentiles(engine.ready["first_live_s"]),
                "steady": _percentiles(steady[name]),
                "warm_up_s": engine.ready.get("warm_up_s"),
            }
            for name, engine in engines.items()
        }
    finally:
        for engine in engines.values():
            engine.stop()
    rows = {}
    for key, per in times.items():
        kind, size = key.split()
        tokens = int(size) * (PREFILL[1] if kind == "prefill" else 1)
        ms = {name: statistics.median(t) * 1e3 for name, t in per.items()}
        rows[key] = {
            "ms": ms,
            "tokens_per_s": {name: tokens / (m / 1e3) for name, m in ms.items()},
            "vs_inductor": paired_ratios(per, "inductor"),
            "vs_one_stream": paired_ratios(per, "one stream"),
            "tokens_equal_inductor": same[key],
        }
    return {
        "vllm": vllm.__version__,
        "torch": __import__("torch").__version__,
        "cores": os.cpu_count(),
        "model": {"hidden": hidden, "layers": layers, "experts": 8, "top_k": 2},
        "rounds": rounds,
        "steps": steps,
        "rows": rows,
        "placements": placements,
        "live": live,
    }


def _percentiles(seconds: list[float]) -> dict[str, float]:
    """p50 and p99 of step times, in ms (p99 of 100 steps: the second slowest)."""
    ms = sorted(t * 1e3 for t in seconds)
    return {"p50": statistics.median(ms), "p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))]}


def format_vllm(report: dict[str, Any]) -> str:
    """The report as a table: per shape, each runner's step time and its ratio to Inductor."""
    names = list(RUNNERS)
    lines = [
        f"vllm {report['vllm']} (CPU), torch {report['torch']}, {report['cores']} cores: tiny "
        f"Qwen2-MoE {report['model']}; medians of {report['rounds']} rounds, engines in turn; "
        f"decode rows: one step of B sequences ({report['steps']} steps), prefill: "
        f"{PREFILL[0]} x {PREFILL[1]} tokens",
        f"  {'shape':<11}" + "".join(f"{n:>22}" for n in names),
    ]
    for key, row in report["rows"].items():
        cells = []
        for n in names:
            mark = "" if row["tokens_equal_inductor"][n] else " (tokens differ)"
            cells.append(f"{row['ms'][n]:8.2f} ms {row['vs_inductor'][n]:5.2f}x{mark}")
        lines.append(f"  {key:<11}" + "".join(f"{c:>22}" for c in cells))
    lines.append("  x: Inductor's step time over the runner's, the median of the rounds' ratios")
    codes = {n: [g.get("code") for g in gs] for n, gs in report["placements"].items()}
    for n in names[2:]:
        ratios = ", ".join(f"{k} {r['vs_one_stream'][n]:.2f}x" for k, r in report["rows"].items())
        same = codes[n] == codes["one stream"] and None not in codes[n]
        same_text = " (the same code as one stream's)" if same else ""
        lines.append(f"  {n} / one stream, per row{same_text}: {ratios}")
    sequences, steps = LIVE
    lines.append(
        f"  live steps ({sequences} prompts x {steps} new tokens, engine.step() timed), the first "
        "after start-up / the steady state, p50 / p99 ms:"
    )
    for name, live in report.get("live", {}).items():
        first, steady = live["first"], live["steady"]
        warm = live.get("warm_up_s")
        said = "" if warm is None else f"   (airstream warm_up at start-up: {warm:.1f} s)"
        lines.append(
            f"  {name:<14} first {first['p50']:7.2f} / {first['p99']:7.2f}   "
            f"steady {steady['p50']:7.2f} / {steady['p99']:7.2f}{said}"
        )
    for name, graphs in report["placements"].items():
        for graph in graphs:
            sides = graph["side_streams"] or "nothing on a side stream"
            lines.append(f"  {name}, {graph['kind']} graph: {sides}")
            lines += [f"    {line}" for line in (graph["measured"] or "").splitlines()]
    return "\n".join(lines)


if __name__ == "__main__":
    _engine(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
