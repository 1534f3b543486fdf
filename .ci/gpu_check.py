"""GPU check for reduce-overhead (run on a CUDA machine: `python .ci/gpu_check.py`).

A 4 x Linear(4096, 4096) model compiled with airstream in reduce-overhead. Asserted, not just
printed: its graph is captured into a CUDA graph once; every weight is captured by address (the
graph reads the parameter itself, at the address it had at capture: no copy per replay, no
second copy in memory), so compile, capture and two calls add less than half the weights' size
to the GPU memory in use; results equal eager, also after an in-place weight update, with no
second capture. Prints the figures and a JSON report last; exits 1, saying which claim failed,
when one does.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

import airstream

MEMORY_BOUND = 0.5  # of the weights' size: what compile + capture + 2 calls may add


def check() -> tuple[dict[str, Any], list[str]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda().eval()
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    config = airstream.CompilerConfig()
    config.mode = "reduce-overhead"
    backend = airstream.get_backend(config)
    opt = torch.compile(model, backend=backend)
    x = torch.randn(8, 4096, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        opt(x)
        opt(torch.randn(8, 4096, device="cuda"))
    torch.cuda.synchronize()
    added = torch.cuda.memory_allocated() - before
    failures: list[str] = []
    ex = backend.graphs[-1].executor
    facts: dict[str, Any] = {
        "graphs": len(backend.graphs),
        "executor": type(ex).__name__,
        "weights_mib": round(weights / 2**20, 1),
        "added_mib": round(added / 2**20, 1),
        "memory_bound_mib": round(MEMORY_BOUND * weights / 2**20, 1),
    }
    if not hasattr(ex, "captures"):
        failures.append(f"the executor is a {type(ex).__name__}, not a CUDA graph executor")
        return facts, failures
    blockers = list(getattr(ex, "blockers", []))
    facts.update(captures=ex.captures, blockers=blockers)
    if blockers or ex.captures != 1:
        failures.append(f"expected one capture, got {ex.captures} (blockers: {blockers})")
    # the inputs the graph reads at their address (the executor's record of its capture): each
    # parameter itself, at the address it has
    inputs = getattr(ex, "_inputs", None)
    indices = getattr(ex, "_static_indices", None)
    addresses = getattr(ex, "_addresses", None)
    if inputs is None or indices is None or addresses is None:
        failures.append("the executor has no _inputs/_static_indices/_addresses: update me")
        return facts, failures
    by_address = [(inputs[i], addresses[i]) for i in indices if i < len(inputs)]
    missing = [
        name
        for name, p in model.named_parameters()
        if not any(b is p and address == p.data_ptr() for b, address in by_address)
    ]
    facts["weights_by_address"] = f"{len(params) - len(missing)} of {len(params)}"
    if missing:
        failures.append(f"weights not captured by address: {', '.join(missing)}")
    if added >= MEMORY_BOUND * weights:
        failures.append(
            f"compile + capture + 2 calls added {added / 2**20:.1f} MiB, not under "
            f"{MEMORY_BOUND} x the weights ({weights / 2**20:.0f} MiB): a copy of them?"
        )
    with torch.no_grad():
        for when in ("before", "after"):
            if when == "after":
                model[0].weight.add_(1.0)  # in place: same address, new values
            try:
                torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
            except AssertionError as error:
                first = str(error).strip().splitlines()[:3]
                failures.append(f"differs from eager {when} an in-place weight update: {first}")
    facts["captures_at_end"] = ex.captures
    if ex.captures != 1:
        failures.append(f"captured again ({ex.captures} captures) after an in-place update")
    return facts, failures


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_check: FAILED: no CUDA GPU visible to torch", file=sys.stderr)
        return 1
    facts, failures = check()
    print(
        f"executor {facts['executor']}, captures {facts.get('captures')}; weights "
        f"{facts['weights_mib']} MiB, by address {facts.get('weights_by_address')}; compile + "
        f"capture + 2 calls added {facts['added_mib']} MiB (bound {facts['memory_bound_mib']})"
    )
    facts["failures"] = failures
    print(json.dumps(facts, indent=2))
    for failure in failures:
        print(f"gpu_check: FAILED: {failure}", file=sys.stderr)
    if not failures:
        print("gpu_check: passed: one capture, weights by address, equal to eager", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
