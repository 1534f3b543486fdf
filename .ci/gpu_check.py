import torch, airstream
from airstream.runtime.cuda import CudaGraphExecutor
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda().eval()
weights = sum(p.numel() * p.element_size() for p in model.parameters())
backend = airstream.get_backend()
opt = torch.compile(model, backend=backend)
x = torch.randn(8, 4096, device="cuda")
torch.cuda.synchronize(); before = torch.cuda.memory_allocated()
with torch.no_grad():
    out = opt(x); out2 = opt(torch.randn(8, 4096, device="cuda"))
torch.cuda.synchronize(); after = torch.cuda.memory_allocated()
ex = backend.graphs[-1].executor
print("executor", type(ex).__name__, "static", sorted(ex.static), "captures", ex.captures)
params = list(model.parameters())
print("weights captured by address:", all(any(b is p for p in params) for i, b in enumerate(ex._inputs) if i in ex.static))
print(f"weights {weights/2**20:.0f} MiB; memory added by compile+capture+2 calls {(after-before)/2**20:.1f} MiB")
with torch.no_grad():
    torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
    model[0].weight.add_(1.0)
    torch.testing.assert_close(opt(x), model(x), rtol=1e-4, atol=1e-4)
print("matches eager, also after an in-place weight update; captures", ex.captures)
