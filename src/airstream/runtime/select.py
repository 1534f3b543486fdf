"""Which executor runs a planned graph: the one decision that depends on the device, the mode and
the debug options."""

from __future__ import annotations

import torch
import torch.fx

from airstream import torch_internals
from airstream.machine.openmp import openmp
from airstream.ops.torch_streams import torch_streams_of
from airstream.options.config import CompilerConfig
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.codegen import Executor
from airstream.runtime.cpu import CpuExecutor
from airstream.runtime.cuda import CudaExecutor
from airstream.runtime.cuda_graphs import CudaGraphExecutor
from airstream.runtime.data_dump import DataDumpExecutor
from airstream.runtime.serial import SerialExecutor
from airstream.runtime.torch_streams import TorchStreamObjects
from airstream.schedule.plan import StreamPlan

__all__ = ["choose_executor"]


def choose_executor(
    gm: torch.fx.GraphModule,
    plan: StreamPlan,
    kind: str,
    config: CompilerConfig,
    mode: str,
    device: torch.device,
    static_inputs: tuple[int, ...] | None = None,
    capture_pool: CapturePool | None = None,
) -> Executor:
    """Node by node for data_dump; serial for run_eagerly; CUDA streams on a CUDA ``device``
    (the graph's, :func:`airstream.graph.devices.graph_device`; captured as CUDA graphs in ``mode``
    reduce-overhead, the mode the graph compiles in); threads elsewhere. A CPU graph with
    nothing off the main stream runs serially: no thread to hand off to. ``static_inputs``: the
    parameter and buffer inputs, where the caller knows them (a graph loaded from the compile
    cache); else AOTAutograd says. ``capture_pool``: the CUDA graph memory pool the graph shares
    with the others of its compiled function."""
    dump = config.debug.data_dump
    if dump.type is not None:
        return DataDumpExecutor(gm, dump.path, dump.filter)
    if config.debug.run_eagerly:
        return SerialExecutor(gm, plan)
    if device.type == "cuda":
        return _cuda_executor(gm, plan, kind, config, mode, device, static_inputs, capture_pool)
    if not any(s.runs for s in plan.side_streams):
        return SerialExecutor(gm, plan)
    streams = config.stream_config
    return CpuExecutor(
        gm,
        plan,
        streams.threads_per_stream,
        # released only where they spin long: after a short spin, the release costs more
        release_openmp_threads=streams.release_openmp_threads and openmp().spins_long,
        openmp_team=streams.openmp_team,
    )


def _cuda_executor(
    gm: torch.fx.GraphModule,
    plan: StreamPlan,
    kind: str,
    config: CompilerConfig,
    mode: str,
    device: torch.device,
    static_inputs: tuple[int, ...] | None,
    capture_pool: CapturePool | None,
) -> Executor:
    """CUDA streams, captured as a CUDA graph in reduce-overhead."""
    table = torch_streams_of(gm)
    objects = None
    if table is not None:
        objects = TorchStreamObjects(table, at_run_time=kind != "backward")
    executor = CudaExecutor(gm, plan, device, native=objects)
    if mode == "reduce-overhead":
        # Parameters and buffers are the same tensors every call: captured by address.
        torch_internals.require("cuda-graphs")
        static = static_inputs
        if static is None and kind != "backward":
            static = torch_internals.static_input_indices()
        # a forward's tensors saved for its backward: handed over in the pool, not copied
        saved = None
        if kind == "forward" and static_inputs is None:
            start = torch_internals.saved_for_backward_start()
            if start is not None:
                (output,) = gm.graph.find_nodes(op="output")
                saved = range(start, len(output.args[0]))
        return CudaGraphExecutor(
            executor,
            gm,
            static or (),
            pool=capture_pool,
            rerecord_limit=config.experimental_config.cuda_graph_rerecord_limit,
            saved=saved,
        )
    return executor
