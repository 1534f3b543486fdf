"""``airstream selftest opinfo``: PyTorch's operator database through airstream.

Every CPU float32 sample of every OpInfo (``torch.testing._internal.common_methods_invocations``)
is traced to an aten graph (``make_fx``) and compiled by each configuration, then compared with
eager PyTorch (NaNs equal; random ops are reseeded before each run). The tolerance is the OpInfo's
own: the loosest float32 ``toleranceOverride`` it declares for CPU in any of its tests, never below
``torch.testing.assert_close``'s float32 defaults (``opinfo_tolerance``):

- ``airstream``: the default pipeline, one stream,
- ``airstream 3 streams``: every node put on one of 3 streams at random (fixed seed), so every
  cross-stream edge needs the planner's syncs,
- ``airstream run_eagerly``: the serial reference executor,
- ``airstream max-autotune`` and ``airstream max-autotune 3 streams``: Inductor-compiled
  segments, on one stream and on the 3 random streams, with ``min_segment_ops=1`` so that a
  sample of a single op goes through Inductor too,
- ``aot_eager`` and ``inductor``: PyTorch's own backends on the same graphs, the anchors.

A sample ``passes``, ``fails`` (a wrong result without an error) or ``errors``; samples eager
itself cannot run or trace, and value mismatches of ``empty*`` ops (uninitialized memory), are
skipped. An airstream failure is classified: ``torch`` when aot_eager fails the same sample too
(for the max-autotune configurations, also when Inductor does), else ``ours``.
Ops are named with their variant (``nn.functional.dropout.train``) so that two
variants of one op are never confused.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.proxy_tensor import make_fx

from airstream.backend import AirstreamBackend
from airstream.config import CompilerConfig
from airstream.ops.library import STREAM_LABEL_KEY, is_air_op, scope_enter, scope_exit

__all__ = [
    "CONFIGS",
    "INDUCTOR_CONFIGS",
    "SampleResult",
    "format_sweep",
    "load_sweep",
    "opinfo_tolerance",
    "random_streams",
    "run_sweep",
    "sweep_op",
]

CONFIGS = (
    "airstream",
    "airstream 3 streams",
    "airstream run_eagerly",
    "airstream max-autotune",
    "airstream max-autotune 3 streams",
    "aot_eager",
    "inductor",
)
# Configurations that compile with Inductor (C++ per sample on CPU: slow for the whole database).
INDUCTOR_CONFIGS = ("airstream max-autotune", "airstream max-autotune 3 streams", "inductor")


def random_streams(seed: int = 0, labels: Sequence[str | None] = (None, "r1", "r2")) -> Any:
    """A pass wrapping every node in a scope of a randomly chosen stream (fixed seed)."""

    def random_streams_pass(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        rng = random.Random(seed)
        graph = gm.graph
        for node in list(graph.nodes):
            if node.op != "call_function" or is_air_op(node.target):
                continue
            label = rng.choice(labels)
            if label is None:
                continue
            with graph.inserting_before(node):
                graph.call_function(scope_enter, ([STREAM_LABEL_KEY], [label]))
            with graph.inserting_after(node):
                graph.call_function(scope_exit, ())

    return random_streams_pass


@dataclass(frozen=True)
class _Compiled:
    """An airstream-compiled sample and how many of its max-autotune segments fell back."""

    fn: Callable[..., Any]
    fallbacks: int

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _airstream(config: CompilerConfig) -> Callable[..., Any]:
    def compile_graph(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
        backend = AirstreamBackend(config)
        fn = backend(gm, inputs)
        fallbacks = sum(1 for g in backend.graphs for s in g.segments if s.node is None)
        return _Compiled(fn, fallbacks)

    return compile_graph


def _aot_eager(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
    from torch._dynamo.backends.debugging import aot_eager

    return aot_eager(gm, inputs)


def _inductor(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, list(inputs))


def compilers() -> dict[str, Callable[..., Any]]:
    """Each configuration's ``(gm, example_inputs) -> callable``."""
    multi = CompilerConfig()
    multi.post_grad_custom_pre_pass = random_streams(0)
    eager = CompilerConfig()
    eager.debug.run_eagerly = True
    # max-autotune with segments of any length: every op goes through Inductor, even alone
    fused = CompilerConfig()
    fused.mode = "max-autotune"
    fused.experimental_config.min_segment_ops = 1
    fused_multi = CompilerConfig()
    fused_multi.mode = "max-autotune"
    fused_multi.experimental_config.min_segment_ops = 1
    fused_multi.post_grad_custom_pre_pass = random_streams(0)
    return {
        "airstream": _airstream(CompilerConfig()),
        "airstream 3 streams": _airstream(multi),
        "airstream run_eagerly": _airstream(eager),
        "airstream max-autotune": _airstream(fused),
        "airstream max-autotune 3 streams": _airstream(fused_multi),
        "aot_eager": _aot_eager,
        "inductor": _inductor,
    }


@dataclass
class SampleResult:
    """One sample under one configuration: ``pass``, ``fail`` or ``error`` (with a reason)."""

    op: str
    index: int
    config: str
    outcome: str
    reason: str = ""
    fallbacks: int = 0  # max-autotune segments that ran as aten code (Inductor failed)


def _leaves(sample: Any) -> tuple[list[torch.Tensor], Callable[[Sequence[torch.Tensor]], Any]]:
    """The sample's tensors, and a function rebuilding (input, args, kwargs) from new tensors."""
    flat, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(flat) if isinstance(leaf, torch.Tensor)]

    def rebuild(tensors: Sequence[torch.Tensor]) -> Any:
        new = list(flat)
        for pos, tensor in zip(positions, tensors, strict=True):
            new[pos] = tensor
        return pytree.tree_unflatten(new, spec)

    return [flat[i] for i in positions], rebuild


_FLOAT32_DEFAULT = (1e-5, 1.3e-6)  # assert_close's (atol, rtol) for float32


def opinfo_tolerance(opinfo: Any) -> tuple[float, float]:
    """``(atol, rtol)`` for an OpInfo's float32 CPU samples: the loosest float32
    ``toleranceOverride`` among its decorators that can apply on CPU, at least the defaults."""
    from torch.testing._internal.common_device_type import toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo

    atol, rtol = _FLOAT32_DEFAULT
    for info in opinfo.decorators:
        if not isinstance(info, DecorateInfo) or info.device_type not in (None, "cpu"):
            continue
        if info.dtypes is not None and torch.float32 not in info.dtypes:
            continue
        for dec in info.decorators:
            if isinstance(dec, toleranceOverride) and torch.float32 in dec.d:
                atol = max(atol, dec.d[torch.float32].atol)
                rtol = max(rtol, dec.d[torch.float32].rtol)
    return atol, rtol


def _compare(got: Any, want: Any, tolerance: tuple[float, float] = _FLOAT32_DEFAULT) -> None:
    atol, rtol = tolerance
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True, check_device=True)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def sweep_op(
    opinfo: Any,
    configs: Sequence[str],
    max_samples: int | None = None,
    builders: dict[str, Callable[..., Any]] | None = None,
) -> list[SampleResult]:
    """Run one OpInfo's CPU float32 samples through ``configs``."""
    builders = builders or compilers()
    results = []
    variant = opinfo.variant_test_name
    name = f"{opinfo.name}.{variant}" if variant else opinfo.name
    tolerance = opinfo_tolerance(opinfo)
    try:
        samples = list(opinfo.sample_inputs("cpu", torch.float32, requires_grad=False))
    except Exception as exc:
        return [SampleResult(name, -1, c, "error", f"sample_inputs: {exc}") for c in configs]
    for index, sample in enumerate(samples[:max_samples]):
        tensors, rebuild = _leaves(sample)

        def fn(*ts: torch.Tensor, rebuild: Any = rebuild) -> tuple[Any, ...]:
            inp, args, kwargs = rebuild(ts)
            # AOTAutograd wants a flat tuple of outputs
            return tuple(pytree.tree_leaves(opinfo.op(inp, *args, **kwargs)))

        try:
            with _quiet():
                torch.manual_seed(0)
                want = fn(*[t.clone() for t in tensors])
                torch.manual_seed(0)
                gm = make_fx(fn)(*[t.clone() for t in tensors])
        except Exception as exc:  # eager or tracing itself fails: not a backend question
            reason = f"eager/trace: {type(exc).__name__}: {str(exc)[:200]}"
            results += [SampleResult(name, index, c, "skip", reason) for c in configs]
            continue
        for config in configs:
            result = _run_one(name, index, config, builders[config], gm, tensors, want, tolerance)
            if "empty" in opinfo.name and result.outcome == "fail":
                # torch.empty and friends return uninitialized memory: values are not comparable
                result = SampleResult(name, index, config, "skip", "uninitialized output")
            results.append(result)
    return results


def _run_one(
    name: str,
    index: int,
    config: str,
    build: Callable[..., Any],
    gm: torch.fx.GraphModule,
    tensors: Sequence[torch.Tensor],
    want: Any,
    tolerance: tuple[float, float] = _FLOAT32_DEFAULT,
) -> SampleResult:
    try:
        with _quiet():
            compiled = build(gm, [t.clone() for t in tensors])
            torch.manual_seed(0)
            got = compiled(*[t.clone() for t in tensors])
    except Exception as exc:
        return SampleResult(name, index, config, "error", f"{type(exc).__name__}: {str(exc)[:300]}")
    fallbacks = getattr(compiled, "fallbacks", 0)
    try:
        _compare(tuple(got), want, tolerance)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        return SampleResult(name, index, config, "fail", reason, fallbacks)
    return SampleResult(name, index, config, "pass", "", fallbacks)


@dataclass
class Sweep:
    """All results of a sweep, with the per-configuration table."""

    results: list[SampleResult] = field(default_factory=list)
    configs: tuple[str, ...] = CONFIGS
    seconds: float = 0.0

    def table(self) -> dict[str, dict[str, int]]:
        """Per configuration: ops passed (every sample), failed (a wrong result), errored, and
        sample counts."""
        out: dict[str, dict[str, int]] = {}
        for config in self.configs:
            rows = [r for r in self.results if r.config == config and r.outcome != "skip"]
            by_op: dict[str, set[str]] = {}
            for r in rows:
                by_op.setdefault(r.op, set()).add(r.outcome)
            out[config] = {
                "ops_passed": sum(1 for o in by_op.values() if o == {"pass"}),
                "ops_failed": sum(1 for o in by_op.values() if "fail" in o),
                "ops_errored": sum(1 for o in by_op.values() if "error" in o and "fail" not in o),
                "samples": len(rows),
                "samples_passed": sum(1 for r in rows if r.outcome == "pass"),
                "samples_failed": sum(1 for r in rows if r.outcome == "fail"),
                "samples_errored": sum(1 for r in rows if r.outcome == "error"),
                "samples_fallback": sum(1 for r in rows if r.fallbacks),
            }
        return out

    def classified(self) -> list[tuple[SampleResult, str]]:
        """Every airstream failure or error with ``torch`` (aot_eager fails it too; for
        max-autotune, or Inductor does) or ``ours``."""
        bad = ("fail", "error")
        failed = {(r.config, r.op, r.index) for r in self.results if r.outcome in ("fail", "error")}
        out = []
        for r in self.results:
            if r.config.startswith("airstream") and r.outcome in bad:
                theirs = ("aot_eager", r.op, r.index) in failed or (
                    "max-autotune" in r.config and ("inductor", r.op, r.index) in failed
                )
                out.append((r, "torch" if theirs else "ours"))
        return out


def run_sweep(
    ops: Sequence[str] | None = None,
    max_samples: int | None = None,
    inductor: bool = True,
    progress: bool = False,
    configs: Sequence[str] | None = None,
    shard: tuple[int, int] = (0, 1),
    results_path: str | None = None,
) -> dict[str, Any]:
    """Sweep ``ops`` (names; default all of op_db) through ``configs`` (default: all, without
    the Inductor-based ones unless ``inductor``); return the table and classified failures.

    ``shard=(k, n)`` sweeps every n-th op from the k-th (n processes share a long sweep);
    ``results_path`` appends each op's results as JSON lines as soon as it is done, so a long
    sweep loses nothing when stopped (:func:`load_sweep` rebuilds the report from such files).
    """
    from torch.testing._internal.common_methods_invocations import op_db

    if configs is None:
        configs = tuple(c for c in CONFIGS if inductor or c not in INDUCTOR_CONFIGS)
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown sweep configuration(s) {unknown}; choose from {CONFIGS}")
    if "aot_eager" not in configs:
        configs = (*configs, "aot_eager")  # the anchor every failure is classified against
    index, count = shard
    if not 0 <= index < count:
        raise ValueError(f"shard must be k/n with 0 <= k < n, got {index}/{count}")
    wanted = [o for o in op_db if torch.float32 in o.supported_dtypes("cpu")]
    if ops:
        wanted = [o for o in wanted if o.name in ops or f"{o.name}.{o.variant_test_name}" in ops]
    wanted = wanted[index::count]
    sweep = Sweep(configs=tuple(configs))
    builders = compilers()
    start = time.perf_counter()
    for i, opinfo in enumerate(wanted):
        results = sweep_op(opinfo, configs, max_samples, builders)
        sweep.results += results
        if results_path is not None:
            with open(results_path, "a") as f:
                f.writelines(json.dumps(asdict(r)) + "\n" for r in results)
        if progress and i % 25 == 0:
            print(f"[{i}/{len(wanted)}] {opinfo.name}", file=sys.stderr, flush=True)
        torch._dynamo.reset()
    sweep.seconds = time.perf_counter() - start
    return _report(sweep, len(wanted), max_samples)


def load_sweep(paths: Sequence[str], max_samples: int | None = None) -> dict[str, Any]:
    """The report of one sweep stored by ``run_sweep(results_path=...)`` in one or more files
    (e.g. one per shard)."""
    results = []
    for path in paths:
        with open(path) as f:
            results += [SampleResult(**json.loads(line)) for line in f if line.strip()]
    configs = tuple(dict.fromkeys(r.config for r in results))
    sweep = Sweep(results, tuple(c for c in CONFIGS if c in configs))
    return _report(sweep, len({r.op for r in results}), max_samples)


def _report(sweep: Sweep, ops: int, max_samples: int | None) -> dict[str, Any]:
    classified = sweep.classified()
    return {
        "ops": ops,
        "max_samples": max_samples,
        "seconds": round(sweep.seconds, 1),
        "table": sweep.table(),
        "ours": [
            {
                "op": r.op,
                "sample": r.index,
                "config": r.config,
                "outcome": r.outcome,
                "reason": r.reason,
            }
            for r, who in classified
            if who == "ours"
        ],
        "torch": len([1 for _, who in classified if who == "torch"]),
        "fallback_ops": sorted({f"{r.op} ({r.config})" for r in sweep.results if r.fallbacks}),
        "silent_mismatches_ours": len(
            [1 for r, who in classified if who == "ours" and r.outcome == "fail"]
        ),
    }


def format_sweep(report: dict[str, Any]) -> str:
    """The sweep as a table, then our failures."""
    limit = report["max_samples"]
    samples = "all samples" if limit is None else f"<= {limit} samples per op"
    lines = [
        f"OpInfo sweep: {report['ops']} ops, CPU float32, {samples}, {report['seconds']} s",
        f"{'configuration':<34}{'ops pass':>9}{'fail':>6}{'error':>7}{'samples':>9}"
        f"{'pass':>7}{'fail':>6}{'error':>7}{'aten fallback':>15}",
    ]
    for config, row in report["table"].items():
        lines.append(
            f"{config:<34}{row['ops_passed']:>9}{row['ops_failed']:>6}{row['ops_errored']:>7}"
            f"{row['samples']:>9}{row['samples_passed']:>7}{row['samples_failed']:>6}"
            f"{row['samples_errored']:>7}{row.get('samples_fallback', 0):>15}"
        )
    lines.append(
        f"airstream failures also failing under aot_eager (torch's): {report['torch']}; "
        f"ours: {len(report['ours'])}, of which silent mismatches: "
        f"{report['silent_mismatches_ours']}"
    )
    if report.get("fallback_ops"):
        lines.append(
            "max-autotune segments Inductor could not compile (run as aten code): "
            + ", ".join(report["fallback_ops"])
        )
    for row in report["ours"]:
        lines.append(
            f"  {row['op']}[{row['sample']}] {row['config']}: {row['outcome']}: {row['reason']}"
        )
    return "\n".join(lines)
