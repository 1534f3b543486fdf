"""CUDA graphs (``mode="reduce-overhead"``): a CudaExecutor's whole multi-stream call, captured
once and replayed.

The fork/join shape of every call is what makes a multi-stream capture legal. Parameters and
buffers (``static``: their input indices, from AOTAutograd) are captured by address, as torch's
cudagraph trees do: a replay reads them where they are, checks that they have not moved in one C
call, and copies the other inputs into the graph's own buffers (same strides) as one batched
copy. Outputs in the graph's memory are copied out (one batched copy), so a result survives the
next replay; an output that is a static input's memory (a returned weight, or a view of one) is
returned as it is, as eager would. A replay is one opaque launch: profiling sees no per-op
records for it (use ``mode="max-autotune"`` to profile streams).

As in cudagraph trees:

- **a forward and its backward share one memory pool** (:mod:`airstream.runtime.capture_pool`),
  and their replays run one after the other;
- **a static input that moves is captured again, up to a limit** (``rerecord_limit``: a module's
  weights replaced by new tensors each call would otherwise capture on every call); past it, one
  warning, and the graph runs on streams without capture;
- **a graph that writes a parameter or buffer is captured** (a BatchNorm's running statistics,
  a cache kept in a buffer): the replay writes the tensor itself; the warm-up runs that write on
  copies, so each call writes once. A write to any other input keeps the graph from capture (the
  replay reads such an input from the graph's copy of it).

What makes it safe:

- **what cannot be captured is not tried**: :func:`capture_blockers` reads the graph (symbolic or
  data-dependent shapes, host reads such as ``.item()``, tensors off the GPU, two devices, writes
  to inputs other than parameters and buffers, random ops); a call made while the caller's own
  stream is capturing (the user's ``torch.cuda.graph``) is issued into that capture instead;
- **a capture that fails anyway leaves nothing behind**: the stream, the device, the allocator's
  capture state and the pool's use count are restored, a warning says why, and the graph runs on
  streams without capture from then on;
- **captures run one at a time in the process**, in thread-local capture mode, on the device's
  capture stream, with cuBLAS workspaces cleared before and after (as torch's cudagraph trees
  do);
- **replays from callers on different streams are ordered**: each call's stream waits for the
  previous replay of any graph of its pool and that replay's output copies before it overwrites
  the input buffers.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from airstream.config import CUDA_GRAPH_RERECORD_LIMIT
from airstream.effects import alias_classes, effects
from airstream.nodes import describe
from airstream.ops.torch_streams import NATIVE_HOST_SYNCS
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.cuda import CudaExecutor
from airstream.runtime.torch_streams import TorchStreamsAround
from airstream.torch_internals import data_ptrs_equal, foreach_copy

__all__ = [
    "CaptureFailed",
    "CudaGraphExecutor",
    "capture_blockers",
    "copy_like",
    "written_inputs",
]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


class CaptureFailed(RuntimeError):
    """CUDA graph capture failed; the process was left as before it started."""


def _tensors(val: Any) -> list[torch.Tensor]:
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, list | tuple):
        return [v for v in val if isinstance(v, torch.Tensor)]
    return []


def _symbolic(val: Any) -> bool:
    if isinstance(val, _SYMBOLIC):
        return True
    if isinstance(val, list | tuple):
        return any(_symbolic(v) for v in val)
    if isinstance(val, torch.Tensor):
        return any(isinstance(d, _SYMBOLIC) for d in (*val.shape, *val.stride()))
    return False


def written_inputs(gm: torch.fx.GraphModule) -> dict[int, torch.fx.Node]:
    """The inputs ``gm`` writes in place (through a view of them too): input index -> the first
    node writing it."""
    classes = alias_classes(gm.graph)
    index = {node: i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))}
    written: dict[int, torch.fx.Node] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        for target in effects(node).writes:
            i = index.get(classes.get(target, target))
            if i is not None:
                written.setdefault(i, node)
    return written


def capture_blockers(gm: torch.fx.GraphModule, static: Collection[int] = ()) -> list[str]:
    """Why ``gm`` cannot be captured into a CUDA graph (empty if it can). ``static``: the indices
    of the inputs that are parameters and buffers, which a captured graph may write."""
    reasons: list[str] = []
    devices: dict[torch.device, torch.fx.Node] = {}
    placeholders = gm.graph.find_nodes(op="placeholder")
    for i, writer in written_inputs(gm).items():
        if i not in static:
            reasons.append(
                f"{describe(writer)} writes input {placeholders[i].name}, which is not a "
                "parameter or buffer (a replay reads such an input from the graph's own copy)"
            )
    for node in gm.graph.nodes:
        if node.op == "output":
            continue
        val = node.meta.get("val")
        name = f"input {node.name}" if node.op == "placeholder" else describe(node)
        if _symbolic(val):
            if free_unbacked_symbols(val):
                reasons.append(f"{name} has a shape that depends on tensor values")
            else:
                reasons.append(f"symbolic shape at {name}")
        for tensor in _tensors(val):
            if tensor.device.type != "cuda":
                reasons.append(f"{name} is on {tensor.device}")
                break
            devices.setdefault(tensor.device, node)
        if node.op == "call_function":
            found = effects(node)
            if found.random:
                reasons.append(f"{name} draws random numbers")
            if found.host_sync and node.target in NATIVE_HOST_SYNCS:
                reasons.append(f"{name} makes the host wait for the device (a synchronize)")
            elif found.host_sync:
                reasons.append(f"{name} reads device data back to the host")
    if len(devices) > 1:
        where = ", ".join(f"{d} ({n.name})" for d, n in devices.items())
        reasons.append(f"values on more than one device: {where}")
    return reasons


def _expanded(value: torch.Tensor) -> bool:
    """Does ``value`` repeat memory (a stride of 0), which no copy can share memory like?"""
    layout = zip(value.shape, value.stride(), strict=True)
    return any(stride == 0 and size > 1 for size, stride in layout)


def _empty_like(value: torch.Tensor) -> torch.Tensor:
    """Uninitialized memory with ``value``'s strides (``empty_like`` makes gaps contiguous)."""
    return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)


def copy_like(value: Any) -> Any:
    """A copy of ``value`` with its strides (``clone`` makes a tensor with gaps contiguous); an
    expanded tensor comes back contiguous."""
    if not isinstance(value, torch.Tensor):
        return value
    if _expanded(value):
        return value.clone(memory_format=torch.contiguous_format)
    out = _empty_like(value)
    out.copy_(value)
    return out


class CudaGraphExecutor:
    """Captures a CudaExecutor's call into a CUDA graph on first use, then replays it.

    If a static input is a different tensor than at capture (a module's weights replaced by new
    tensors), the graph is captured again, at most ``rerecord_limit`` times. ``pool``: the
    memory pool and replay order shared with the other graphs of the same compiled function (a
    pool of its own if None).
    """

    def __init__(
        self,
        inner: CudaExecutor,
        gm: torch.fx.GraphModule,
        static: Sequence[int] = (),
        warmup: int = 2,
        pool: CapturePool | None = None,
        rerecord_limit: int = CUDA_GRAPH_RERECORD_LIMIT,
    ) -> None:
        self._boxed_call = True
        self.inner = inner
        self.api = inner.api
        self.device = inner.device
        self.static = frozenset(static)
        self.blockers = capture_blockers(gm, self.static)
        self.warmup = warmup
        self.pool = pool if pool is not None else CapturePool()
        self.rerecord_limit = rerecord_limit
        self.captures = 0  # how many times a graph was captured (recaptures included)
        self.rerecords = 0  # how many of those because a static input moved
        self._names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
        # the parameters and buffers the graph writes: the warm-up writes copies of them
        self._written = frozenset(written_inputs(gm)) & self.static
        self._graph: Any = None
        self._inputs: list[Any] = []  # per input: the static tensor itself, or our buffer
        self._copies: list[tuple[int, torch.Tensor]] = []  # (input index, buffer) to refresh
        self._addresses: list[int | None] = []  # per input: its data_ptr at capture if static
        self._static_indices: list[int] = []  # the static inputs' positions
        self._static_outputs: Any = None
        self._own: list[int] = []  # the outputs in the graph's memory (copied out per replay)
        self._around = TorchStreamsAround(gm)  # the user's events the call waits for and records

    @property
    def code(self) -> str:
        """The generated code the graph was captured from."""
        return str(self.inner.code)

    def _capture(self, args: Sequence[Any]) -> None:
        """Warm up, then capture one call on the device's capture stream into the pool."""
        api, device = self.api, self.device
        caller = api.current_stream(device)
        inputs = [copy_like(a) if i not in self.static else a for i, a in enumerate(args)]
        # a parameter or buffer the graph writes is written by the replay only, once per call
        warm = [copy_like(a) if i in self._written else a for i, a in enumerate(inputs)]
        with api.capture_lock:
            stream = api.capture_stream(device)
            stream.wait_stream(caller)  # the input copies, and whatever made the inputs
            api.set_stream(stream)
            try:
                for _ in range(self.warmup):  # a model error here is the caller's to see
                    self.inner(list(warm))
                del warm
                self.inner.side_streams(capturing=True)  # drawn now, not inside the capture
                graph, memory = api.new_graph(), self.pool.memory(api, device)
                uses = memory.use_count()
                # The capture allocates its own cuBLAS workspace inside its pool: one cached
                # by the warm-up (outside the pool) would be baked into the graph, then reused.
                api.clear_cublas_workspaces()
                try:
                    api.capture_begin(graph, memory)
                    outputs = self.inner(list(inputs))
                    api.capture_end(graph)
                except BaseException as error:
                    api.set_stream(stream)
                    api.abandon_capture(graph, memory, device, uses)
                    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit
                        raise
                    raise CaptureFailed(f"{type(error).__name__}: {error}") from error
                finally:
                    api.clear_cublas_workspaces()
            finally:
                api.set_stream(caller)
                caller.wait_stream(stream)  # replays come after the warm-up's work
        self._graph = graph
        self._inputs, self._static_outputs = inputs, outputs
        self._copies = [
            (i, buffer)
            for i, buffer in enumerate(inputs)
            if i not in self.static and isinstance(buffer, torch.Tensor)
        ]
        self._static_indices = [
            i for i, a in enumerate(args) if i in self.static and isinstance(a, torch.Tensor)
        ]
        self._addresses = [None] * len(args)
        for i in self._static_indices:
            self._addresses[i] = args[i].data_ptr()
        weights = {args[i].untyped_storage().data_ptr() for i in self._static_indices}
        self._own = [
            i
            for i, out in enumerate(outputs)
            if isinstance(out, torch.Tensor) and out.untyped_storage().data_ptr() not in weights
        ]
        self.captures += 1

    def _moved(self, args: list[Any]) -> bool:
        """A static input is not the tensor the graph captured (one C call for all of them)."""
        if not self._static_indices:
            return False
        return not data_ptrs_equal(args, self._addresses, self._static_indices)

    def _drop(self) -> None:
        """Let the captured graph and its memory go (the pool's replays are over: call with
        :meth:`CapturePool.wait_idle` done); a capture after this reuses that memory."""
        if self._graph is not None:
            self._graph.reset()  # its use of the pool ends now, not when Python collects it
        self._graph = self._static_outputs = None
        self._inputs, self._copies = [], []

    def _stop_capturing(self, args: list[Any]) -> None:
        """The static inputs moved more than ``rerecord_limit`` times: warn once, then run on
        streams without capture from now on."""
        moved = next(
            (i for i in self._static_indices if args[i].data_ptr() != self._addresses[i]), None
        )
        which = f"input {self._names[moved]}" if moved is not None else "a static input"
        warnings.warn(
            f"airstream: a parameter or buffer of this graph ({which}) was a new tensor at "
            f"{self.rerecords} calls after the first capture, and the graph was captured into a "
            "CUDA graph again at each, up to experimental_config.cuda_graph_rerecord_limit="
            f"{self.rerecord_limit}; from now on it runs on streams without capture. Update "
            "weights in place "
            "(param.data.copy_(new), load_state_dict without assign=True) to keep the replay, "
            "or raise the limit",
            stacklevel=3,
        )
        self.blockers = [f"re-recorded {self.rerecords} times (rerecord limit reached)"]
        self._drop()

    def _outputs(self) -> tuple[Any, ...]:
        """The replay's outputs: those in the graph's memory copied out (one batched copy; an
        expanded one cloned contiguous), the others (a static input's memory) as they are."""
        outputs = list(self._static_outputs)
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        for i in self._own:
            value = outputs[i]
            if _expanded(value):
                outputs[i] = copy_like(value)
                continue
            outputs[i] = _empty_like(value)
            dsts.append(outputs[i])
            srcs.append(value)
        foreach_copy(dsts, srcs)
        return tuple(outputs)

    def __call__(self, args: list[Any]) -> Any:
        if self.blockers:
            return self.inner(args)
        api, device, pool = self.api, self.device, self.pool
        with api.device(device):
            if api.capturing():  # inside the caller's own capture: issue into it
                return self.inner(args)
            with pool.lock:  # one set of buffers, one pool: its graphs replay one at a time
                if self.blockers:  # another caller reached the rerecord limit meanwhile
                    return self.inner(args)
                moved = self._graph is not None and self._moved(args)
                if self._graph is None or moved:
                    pool.wait_idle(device)  # a replay still running uses the old memory
                    if moved:
                        self.rerecords += 1
                        if self.rerecords > self.rerecord_limit:
                            self._stop_capturing(args)
                            return self.inner(args)
                        self._drop()  # before the capture: it may reuse the old graph's memory
                    try:
                        self._capture(args)
                    except CaptureFailed as failure:
                        warnings.warn(
                            f"airstream: CUDA graph capture failed ({failure}); the process "
                            "was left as before the capture, and this graph runs on streams "
                            "without capture from now on",
                            stacklevel=2,
                        )
                        self.blockers = [f"capture failed: {failure}"]
                        return self.inner(args)
                stream = api.current_stream(device)
                # The last replay of the pool may have been issued on another caller's stream:
                # its reads of the input buffers and its output copies come before this call's
                # input copies.
                pool.after_last(stream, device)
                # the inputs that change, in one batched copy; weights are read in place
                foreach_copy([b for _, b in self._copies], [args[i] for i, _ in self._copies])
                args.clear()
                native = self.inner.native if self._around else None
                if native is not None:
                    self._around.before(native, stream, api)
                api.replay(self._graph)
                outputs = self._outputs()
                if native is not None:
                    self._around.after(native, stream)
                pool.mark_done(api, stream, device)
                return outputs
