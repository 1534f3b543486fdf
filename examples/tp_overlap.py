"""A tensor-parallel MLP stack with communication on its own stream, on any number of ranks.

    torchrun --standalone --nproc-per-node 2 examples/tp_overlap.py

Each rank holds its shards of every layer (column-parallel Linear -> GELU -> row-parallel Linear
+ all_reduce, plus an independent branch); ``passes.overlap_communication()`` puts the collectives
and what only they need on stream ``comm``. gloo on CPU, NCCL with one GPU per rank.
"""

import os

import torch
import torch.distributed as dist

import airstream
from airstream.bench.tp import TPModel, TPReference

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
else:
    torch.set_num_threads(1)  # the ranks share this machine's cores

config = airstream.CompilerConfig()
config.post_grad_custom_pre_pass = airstream.passes.overlap_communication()
backend = airstream.get_backend(compiler_config=config)
model = TPModel(layers=4, hidden=256, rank=rank, world=world).to(device)
compiled = torch.compile(model, backend=backend, fullgraph=True)

x = torch.randn(64, 256, generator=torch.Generator().manual_seed(0)).to(device)
with torch.no_grad():
    out = compiled(x)
    want = TPReference(layers=4, hidden=256)(x.cpu())
plan = backend.graphs[-1].plan
if rank == 0:
    print(plan.summary())
ok = torch.allclose(out.cpu(), want, rtol=1e-4, atol=1e-4)
print(f"rank {rank}/{world}: result equals the single-process model: {ok}")
dist.destroy_process_group()
