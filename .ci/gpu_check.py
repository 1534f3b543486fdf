"""GPU check for reduce-overhead (run on a CUDA machine: `python .ci/gpu_check.py`).

A 4 x Linear(4096, 4096) model compiled with airstream: its weights must be captured by address
(no copy per replay, no second copy in memory) and results must equal eager, also after an
in-place weight update.
"""

import torch

import airstream

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda().eval()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
backend = airstream.get_backend()
opt = torch.compile(model, backend=backend)
x = torch.randn(8, 4096, device="cuda")
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
with torch.no_grad():
    opt(x)
    opt(torch.randn(8, 4096, device="cuda"))
torch.cuda.synchronize()
after = torch.cuda.memory_allocated()
ex = backend.graphs[-1].executor
print("executor", type(ex).__name__, "static", sorted(ex.static), "captures", ex.captures)
params = list(model.parameters())
captured = [b for i, b in enumerate(ex._inputs) if i in ex.static]
print("weights captured by address:", all(any(b is p for p in params) for b in captured))
added = (after - before) / 2**20
print(f"weights {weights / 2**20:.0f} MiB; compile + capture + 2 calls added {added:.1f} MiB")
with torch.no_grad():
    torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    model[0].weight.add_(1.0)
    torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
print("matches eager, also after an in-place weight update; captures", ex.captures)
