"""Does a matmul made first on one intra-op thread stay slow at two? (docs/benchmarks.md,
"A measurement that changes what it measures")

For each matmul below: one call at M=512 rows with the calling thread's OpenMP threads lowered to
1 (as a placed candidate's main stream runs while a side stream works), then back to the
caller's count, first calls at M=511 and M=510; then ``--calls`` calls of each M, interleaved;
the median of each. A library whose per-shape state keeps the first call's thread count runs
M=512 slower than its neighbours for good.

    python tools/thread-keyed-cache.py            # in a venv with vLLM's CPU build (.[vllm])
    python tools/thread-keyed-cache.py --calls 300

The matmuls: vLLM's ``_C.onednn_mm`` (float32 and bfloat16; its handler's primitive cache is
keyed by rows, stride and bias, ``csrc/cpu/dnnl_helper.cpp``), and torch's own: ``F.linear``
(float32: MKL), ``torch.mm`` in bfloat16 (oneDNN through ideep), and
``mkldnn._linear_pointwise`` (Inductor's frozen linears: oneDNN) on a reordered weight.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from airstream.machine.openmp import set_intra_op_threads

Matmul = Callable[[torch.Tensor], torch.Tensor]


def _matmuls(k: int, n: int) -> dict[str, tuple[torch.dtype, Matmul]]:
    torch.manual_seed(0)
    weight = torch.randn(n, k)
    found: dict[str, tuple[torch.dtype, Matmul]] = {}
    try:
        import vllm._custom_ops as ops

        for dtype in (torch.float32, torch.bfloat16):
            handler = ops.create_onednn_mm(weight.to(dtype).t(), 32)
            found[f"vllm _C.onednn_mm {dtype}"] = (
                dtype,
                lambda x, h=handler: ops.onednn_mm(h, x, None),
            )
    except ImportError:
        print("(vLLM not installed: its onednn_mm is left out)")
    found["torch F.linear float32 (MKL)"] = (
        torch.float32,
        lambda x: torch.nn.functional.linear(x, weight),
    )
    bf16 = weight.to(torch.bfloat16)
    found["torch mm bfloat16 (oneDNN)"] = (torch.bfloat16, lambda x: torch.mm(x, bf16.t()))
    packed = torch.ops.mkldnn._reorder_linear_weight(bf16, 512)
    found["torch mkldnn._linear_pointwise bfloat16"] = (
        torch.bfloat16,
        lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
    )
    return found


def _median_ms(fn: Matmul, x: torch.Tensor, times: list[float]) -> None:
    start = time.perf_counter()
    fn(x)
    times.append((time.perf_counter() - start) * 1e3)


def measure(name: str, dtype: torch.dtype, fn: Matmul, k: int, calls: int) -> None:
    caller = torch.get_num_threads()
    inputs = {m: torch.randn(m, k).to(dtype) for m in (512, 511, 510)}
    set_intra_op_threads(1)
    fn(inputs[512])  # made on one thread
    set_intra_op_threads(caller)
    fn(inputs[511])  # made on the caller's threads
    fn(inputs[510])
    times: dict[int, list[float]] = {m: [] for m in inputs}
    for _ in range(calls):
        for m, x in inputs.items():
            _median_ms(fn, x, times[m])
    medians = {m: statistics.median(t) for m, t in times.items()}
    ratio = medians[512] / statistics.mean([medians[511], medians[510]])
    print(
        f"{name:<42} M=512 (first on 1 thread) {medians[512]:6.2f} ms   "
        f"M=511 {medians[511]:6.2f} ms   M=510 {medians[510]:6.2f} ms   "
        f"512 / neighbours {ratio:4.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=150, help="timed calls of each M")
    parser.add_argument("-k", type=int, default=512, help="the input's columns")
    parser.add_argument("-n", type=int, default=2048, help="the output's columns")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"x [M, {args.k}] @ w [{args.k}, {args.n}], medians of {args.calls} interleaved calls"
    )
    for name, (dtype, fn) in _matmuls(args.k, args.n).items():
        measure(name, dtype, fn, args.k, args.calls)


if __name__ == "__main__":
    main()
