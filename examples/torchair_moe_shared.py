"""A vllm-ascend-style MoE block: the shared expert overlaps the routed experts through
npu_stream_switch and npu_wait_tensor in the model code.

Run it anywhere with:  airstream run --torchair examples/torchair_moe_shared.py
"""

import torch
import torch_npu  # noqa: F401
from torchair.scope import npu_stream_switch, npu_wait_tensor

import torchair

HIDDEN, EXPERTS, TOKENS = 256, 4, 8


class Expert(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.down = torch.nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


class MoEBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = torch.nn.ModuleList(Expert() for _ in range(EXPERTS))
        self.shared_expert = Expert()

    def forward(self, x):
        router_logits = self.gate(x)
        with npu_stream_switch("shared_expert", 0):
            # start the shared expert once the router has been issued
            shared = self.shared_expert(npu_wait_tensor(x, router_logits))
        weights = torch.softmax(router_logits, dim=-1)
        routed = sum(weights[:, i : i + 1] * e(x) for i, e in enumerate(self.experts))
        return routed + shared


model = MoEBlock().npu()
opt_model = torch.compile(model, backend=torchair.get_npu_backend(), fullgraph=True)
x = torch.randn(TOKENS, HIDDEN).npu()
with torch.no_grad():
    out = opt_model(x)
    want = model(x)
torch.npu.synchronize()
print("result equals eager:", bool(torch.allclose(out, want, rtol=1e-5, atol=1e-5)))
