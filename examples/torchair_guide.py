"""The TorchAir custom-pass guide's multi-stream example, as TorchAir users write it.

Run it anywhere with:  airstream run --torchair examples/torchair_guide.py
"""

import torch
import torch_npu  # noqa: F401

import torchair


class Model(torch.nn.Module):
    def forward(self, x):
        mm = torch.mm(x, x)
        abs = torch.abs(mm)
        add = torch.add(abs, 1)
        sub = torch.sub(x, mm)
        return add, sub


def _custom_pre_pass(gm, example_inputs, config):
    g = gm.graph
    record_node = None
    for node in g.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.mm.default:
            with g.inserting_before(node):
                g.call_function(torch.ops.air.scope_enter.default,
                                args=(["_user_stream_label"], ["stream_1"]))
        if node.op == "call_function" and node.target == torch.ops.aten.abs.default:
            with g.inserting_after(node):
                record_node = g.call_function(torch.ops.air.record.default, args=())
            with g.inserting_after(record_node):
                g.call_function(torch.ops.air.scope_exit.default, args=())
        if node.op == "call_function" and node.target == torch.ops.aten.sub.Tensor:
            with g.inserting_before(node):
                g.call_function(torch.ops.air.wait.default, args=([record_node],))


config = torchair.CompilerConfig()
config.post_grad_custom_pre_pass = _custom_pre_pass
npu_backend = torchair.get_npu_backend(compiler_config=config)
model = Model().npu()
opt_model = torch.compile(model, backend=npu_backend)
x = torch.randn(64, 64).npu()
add, sub = opt_model(x)
eager_add, eager_sub = model(x)
torch.npu.synchronize()
print("result equals eager:", bool(torch.equal(add, eager_add) and torch.equal(sub, eager_sub)))
