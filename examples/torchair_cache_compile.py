"""TorchAir's compile cache, as its guide writes it: the prompt and decode steps of a model compiled
once with torchair.inference.cache_compile, kept in ./.torchair_cache, and loaded by the next run.

Run it twice, anywhere, with:  airstream run --torchair examples/torchair_cache_compile.py
The first run compiles and writes the cache; the second loads it (no trace, no compile).
"""

import dataclasses
import os

import torch
import torch_npu  # noqa: F401
from torchair.configs.compiler_config import CompilerConfig

import torchair

config = CompilerConfig()
config.mode = "reduce-overhead"


@dataclasses.dataclass
class InputMeta:  # the shape of vLLM's input metadata, as TorchAir's guide has it
    data: torch.Tensor
    is_prompt: bool


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(2, 1)
        self.linear2 = torch.nn.Linear(2, 1)
        for param in self.parameters():
            torch.nn.init.ones_(param)
        self.cached_prompt = torchair.inference.cache_compile(self.prompt, config=config)
        self.cached_decode = torchair.inference.cache_compile(self.decode, config=config)

    def forward(self, x: InputMeta, kv: list[torch.Tensor]):
        if x.is_prompt:
            return self.cached_prompt(x, kv)
        return self.cached_decode(x, kv)

    def _forward(self, x, kv):
        return self.linear2(x.data) + self.linear2(kv[0])

    def prompt(self, x, kv):
        return self._forward(x, kv)

    def decode(self, x, kv):
        return self._forward(x, kv)


torch.manual_seed(0)
x = InputMeta(data=torch.randn(2, 2).npu(), is_prompt=True)
kv = [torch.randn(2, 2).npu()]
model = Model().npu()
cache_home = os.path.join(os.getcwd(), ".torchair_cache")
found = os.path.isdir(cache_home)
res_prompt = model(x, kv)
x.is_prompt = False
res_decode = model(x, kv)

expected = model._forward(x, kv)
assert torch.allclose(res_prompt, expected) and torch.allclose(res_decode, expected)
assert os.path.isdir(cache_home), f"no cache directory {cache_home} after compiling"
for entry in sorted(os.listdir(cache_home)):
    for method in ("prompt", "decode"):
        path = os.path.join(cache_home, entry, method, "compiled_module")
        if os.path.isfile(path):
            print(f"{entry}/{method}/compiled_module: {os.path.getsize(path)} bytes")
print("the cache was there before this run (loaded)" if found else "compiled and saved the cache")
