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
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from airstream import torch_internals
from airstream.backend import AirstreamBackend
from airstream.ops.library import STREAM_LABEL_KEY, is_air_op, scope_enter, scope_exit
from airstream.options.config import CompilerConfig
from airstream.selftest.sweep_report import (
    CONFIGS,
    INDUCTOR_CONFIGS,
    SampleResult,
    Sweep,
    append_results,
    format_sweep,
    load_sweep,
    sweep_report,
)

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
        "aot_eager": torch_internals.aot_eager,
        "inductor": torch_internals.compile_fx,
    }


def _leaves(sample: Any) -> tuple[list[torch.Tensor], Callable[[Sequence[torch.Tensor]], Any]]:
    """The sample's tensors, and a function rebuilding (input, args, kwargs) from new tensors."""
    flat, spec = torch_internals.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(flat) if isinstance(leaf, torch.Tensor)]

    def rebuild(tensors: Sequence[torch.Tensor]) -> Any:
        new = list(flat)
        for pos, tensor in zip(positions, tensors, strict=True):
            new[pos] = tensor
        return torch_internals.tree_unflatten(new, spec)

    return [flat[i] for i in positions], rebuild


_FLOAT32_DEFAULT = (1e-5, 1.3e-6)  # assert_close's (atol, rtol) for float32


def opinfo_tolerance(opinfo: Any) -> tuple[float, float]:
    """``(atol, rtol)`` for an OpInfo's float32 CPU samples: the loosest float32
    ``toleranceOverride`` among its decorators that can apply on CPU, at least the defaults."""
    classes: tuple[Any, Any] = torch_internals.opinfo_tolerance_decorators()
    toleranceOverride, DecorateInfo = classes
    atol, rtol = _FLOAT32_DEFAULT
    info: Any
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
            return tuple(torch_internals.tree_flatten(opinfo.op(inp, *args, **kwargs))[0])

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
    torch_internals.require("selftest")
    op_db = torch_internals.opinfo_database()
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
            append_results(results_path, results)
        if progress and i % 25 == 0:
            print(f"[{i}/{len(wanted)}] {opinfo.name}", file=sys.stderr, flush=True)
        torch.compiler.reset()
    sweep.seconds = time.perf_counter() - start
    return sweep_report(sweep, len(wanted), max_samples)
