"""Collectives under CUDA graph capture, on one GPU: a one-rank NCCL process group over a
``HashStore`` (no network). A collective on the main stream is captured and replays right; one on
a side stream keeps its graph from capture, says so once, and runs right on streams."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.conftest import compile_model, graph_of

import airstream
from airstream import torch_internals
from airstream.runtime.cuda_graphs import CudaGraphExecutor

pytestmark = pytest.mark.cuda
funcol = torch_internals.functional_collectives()


@pytest.fixture(scope="module")
def nccl() -> Iterator[None]:
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        pytest.skip("needs a CUDA GPU and NCCL")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _config() -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.mode = "reduce-overhead"
    return config


def _model(w: torch.Tensor, comm: str | None) -> Any:
    def model(x: torch.Tensor) -> torch.Tensor:
        h = torch.mm(x, w)
        if comm is None:
            total = funcol.all_reduce(h, "sum", dist.group.WORLD)
        else:
            with airstream.stream(comm):
                total = funcol.all_reduce(h, "sum", dist.group.WORLD)
        with airstream.stream("side"):
            other = torch.mm(w, x).relu()
        return total + other

    return model


def test_cuda_nccl_all_reduce_on_the_main_stream_is_captured(nccl: None) -> None:
    w = torch.randn(256, 256, device="cuda")
    model = _model(w, None)
    compiled, backend = compile_model(model, _config())
    for i in range(4):
        x = torch.full((256, 256), 0.01 * i, device="cuda")
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and executor.status == "captured"


def test_cuda_nccl_all_reduce_on_a_side_stream_is_not_captured(nccl: None) -> None:
    w = torch.randn(256, 256, device="cuda")
    model = _model(w, "comm")
    compiled, backend = compile_model(model, _config())
    with pytest.warns(UserWarning, match="collective on stream 'comm'"):
        for i in range(4):
            x = torch.full((256, 256), 0.01 * i, device="cuda")
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and executor.captures == 0
