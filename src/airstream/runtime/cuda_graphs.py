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
- **training keeps no second copy**: the forward hands the tensors it saves for the backward
  over in the pool's memory (a fresh alias per replay; ``saved``: their output indices, from
  AOTAutograd), and the backward captures by address every input that is such a tensor or one
  of the forward's parameters, so only its tangents are copied in. Should a forward replay while
  the tensors its previous replay handed over are still held (two forwards before a backward,
  ``retain_graph=True``), it runs on streams without the graph that once, with one warning, and
  the backward that receives those tensors does too: nothing handed over is overwritten;
- **a static input that moves is captured again, up to a limit** (``rerecord_limit``: a module's
  weights replaced by new tensors each call would otherwise capture on every call); past it, one
  warning, and the graph runs on streams without capture;
- **a graph that writes a parameter or buffer is captured** (a BatchNorm's running statistics,
  a cache kept in a buffer): the replay writes the tensor itself; the warm-up runs that write on
  copies, so each call writes once. A write to any other input keeps the graph from capture (the
  replay reads such an input from the graph's copy of it).

What makes it safe:

- **what cannot be captured is not tried, and says so once**: :func:`capture_blockers` reads the
  graph (symbolic or data-dependent shapes, host reads such as ``.item()``, tensors off the GPU,
  two devices, writes to inputs other than parameters and buffers, random ops, a collective off
  the main stream) and the first call warns, naming the node or input; a call made while the
  caller's own stream is capturing (the user's ``torch.cuda.graph``) is issued into that capture
  instead;
- **a capture that fails anyway leaves nothing behind**, whether it fails while being set up
  (the graph, the pool, the workspaces) or inside: the stream, the device, the allocator's
  capture state and the pool's use count are restored, a warning says why, and the graph runs
  on streams without capture from then on;
- **captures run one at a time in the process**, in thread-local capture mode, on the device's
  dedicated capture stream, with cuBLAS workspaces cleared before and after (as torch's
  cudagraph trees do);
- **memory crossing streams is kept**: the warm-up's copies and the graph's input buffers are
  ``record_stream``-ed for the capture stream, and the buffers for each caller stream that
  replays, so the allocator hands none of them out while another stream may still use it;
- **replays from callers on different streams are ordered**: each call's stream waits for the
  previous replay of any graph of its pool and that replay's output copies before it overwrites
  the input buffers;
- **the replay stands for the call**, the user's streams too: the caller's stream waits for the
  user's events the graph waits for and for the user's streams its side work runs on, and after
  the replay records the user's events and makes those streams wait for it, so code after the
  call that waits for the user's stream (or synchronizes it) sees the call's work.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from airstream.options.config import CUDA_GRAPH_RERECORD_LIMIT
from airstream.runtime.capture import (
    Captured,
    CaptureFailed,
    capture_call,
    copy_like,
    empty_strided_like,
    expanded,
)
from airstream.runtime.capture_pool import CapturePool
from airstream.runtime.capture_rules import capture_blockers, written_inputs
from airstream.runtime.cuda import CudaExecutor
from airstream.runtime.torch_streams import TorchStreamsAround
from airstream.torch_internals import data_ptrs_equal, foreach_copy, storage_use_count

__all__ = [
    "CaptureFailed",
    "capture_statuses",
    "CudaGraphExecutor",
    "capture_blockers",
    "copy_like",
    "written_inputs",
]


class CudaGraphExecutor:
    """Captures a CudaExecutor's call into a CUDA graph on first use, then replays it.

    If a static input is a different tensor than at capture (a module's weights replaced by new
    tensors), the graph is captured again, at most ``rerecord_limit`` times. ``pool``: the
    memory pool and replay order shared with the other graphs of the same compiled function (a
    pool of its own if None). ``saved``: a forward graph's outputs that AOTAutograd saves for the
    backward, handed over in the pool's memory (None: every output is copied out).
    """

    def __init__(
        self,
        inner: CudaExecutor,
        gm: torch.fx.GraphModule,
        static: Sequence[int] = (),
        warmup: int = 2,
        pool: CapturePool | None = None,
        rerecord_limit: int = CUDA_GRAPH_RERECORD_LIMIT,
        saved: Collection[int] | None = None,
    ) -> None:
        self._boxed_call = True
        self.inner = inner
        self.api = inner.api
        self.device = inner.device
        self.static = frozenset(static)
        self.blockers = capture_blockers(gm, self.static, inner.plan.stream_of())
        self.warmup = warmup
        self.pool = pool if pool is not None else CapturePool()
        self.rerecord_limit = rerecord_limit
        self.saved = frozenset(saved or ())
        self.captures = 0  # how many times a graph was captured (recaptures included)
        self.rerecords = 0  # how many of those because a static input moved
        self.uncaptured_calls = 0  # calls run on streams although a graph was captured
        self._names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
        # the parameters and buffers the graph writes: the warm-up writes copies of them
        self._written = frozenset(written_inputs(gm)) & self.static
        self._warned: set[str] = set()  # what was warned about once
        self._graph: Any = None
        self._inputs: list[Any] = []  # per input: our buffer, the static tensor itself, or None
        self._copies: list[tuple[int, torch.Tensor]] = []  # (input index, buffer) to refresh
        self._addresses: list[int | None] = []  # per input: its data_ptr at capture if static
        self._static_indices: list[int] = []  # the inputs captured by address
        self._received: list[int] = []  # of those, tensors a forward handed over (a backward's)
        self._static_outputs: Any = None
        self._own: list[int] = []  # the outputs in the graph's memory (copied out per replay)
        self._handed: list[int] = []  # the outputs handed over in place (a forward's saved)
        self._handed_uses: list[tuple[Any, int]] = []  # (storage, its use count when idle)
        self._kept_for: set[Any] = set()  # caller streams the input buffers are kept for
        self._around = TorchStreamsAround(gm, inner.native_side_indices)

    @property
    def code(self) -> str:
        """The generated code the graph was captured from."""
        return str(self.inner.code)

    @property
    def status(self) -> str:
        """Whether this graph replays a CUDA graph, for reports: ``captured``, ``not captured
        yet`` (before its first call), or ``not captured: <why>``."""
        if self.blockers:
            return "not captured: " + "; ".join(self.blockers)
        return "captured" if self._graph is not None else "not captured yet"

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=4)

    def _capture(self, args: Sequence[Any]) -> None:
        """Warm up, then capture one call on the device's capture stream into the pool."""
        by_address = self._by_address(args)
        captured = capture_call(self.inner, self.pool, args, by_address, self._written, self.warmup)
        self._keep_capture(captured, args, by_address)

    def _keep_capture(self, captured: Captured, args: Sequence[Any], by_address: set[int]) -> None:
        """What a replay needs of the capture just made: buffers, addresses, what is handed."""
        inputs, outputs = captured.inputs, captured.outputs
        self._graph = captured.graph
        self._static_outputs = outputs
        self._kept_for = {captured.stream}
        self._static_indices = sorted(i for i in by_address if isinstance(args[i], torch.Tensor))
        self._addresses = [None] * len(args)
        for i in self._static_indices:
            self._addresses[i] = args[i].data_ptr()
        handed = self.pool.handed()
        self._received = [i for i in self._static_indices if _storage(args[i]) in handed]
        # the graph reads what it received at its address; holding it would keep it from the
        # forward that handed it over (whose next replay waits until nothing else holds it)
        self._inputs = [None if i in self._received else a for i, a in enumerate(inputs)]
        self._copies = [
            (i, buffer)
            for i, buffer in enumerate(inputs)
            if i not in by_address and isinstance(buffer, torch.Tensor)
        ]
        weights = {_storage(args[i]) for i in self._static_indices if i not in self._received}
        self.pool.add_weights(weights)
        tensors = [
            i
            for i, out in enumerate(outputs)
            if isinstance(out, torch.Tensor) and _storage(out) not in weights
        ]
        self._handed = [i for i in tensors if i in self.saved]
        self._own = [i for i in tensors if i not in self.saved]
        storages = {_storage(outputs[i]): outputs[i].untyped_storage() for i in self._handed}
        self._handed_uses = [(st, storage_use_count(st)) for st in storages.values()]
        self.pool.set_handed(self, set(storages))
        self.captures += 1

    def _by_address(self, args: Sequence[Any]) -> set[int]:
        """The inputs the graph reads where they are: parameters and buffers, and (a backward)
        what the forward of its pool handed over or took by address."""
        found = set(self.static)
        shared = self.pool.handed() | self.pool.weights
        if shared:
            found |= {
                i
                for i, a in enumerate(args)
                if isinstance(a, torch.Tensor) and _storage(a) in shared
            }
        return found

    def _moved(self, args: list[Any]) -> bool:
        """A static input is not the tensor the graph captured (one C call for all of them)."""
        if not self._static_indices:
            return False
        return not data_ptrs_equal(args, self._addresses, self._static_indices)

    def _weights_moved(self, args: list[Any]) -> bool:
        """A static input other than a handed-over tensor is not the one captured."""
        weights = [i for i in self._static_indices if i not in self._received]
        return bool(weights) and not data_ptrs_equal(args, self._addresses, weights)

    def _received_elsewhere(self, args: list[Any]) -> bool:
        """A tensor the forward hands over arrived from somewhere else: the forward ran without
        its graph for this call (its previous activations were still held)."""
        handed = self.pool.handed()
        return any(
            args[i].data_ptr() != self._addresses[i] and _storage(args[i]) not in handed
            for i in self._received
        )

    def _handed_held(self) -> bool:
        """What the last replay handed over is still held elsewhere (its backward has not run)."""
        return any(storage_use_count(st) > idle for st, idle in self._handed_uses)

    def _uncaptured(self, args: list[Any], why: str) -> Any:
        """This one call on streams, with one warning per cause."""
        self.uncaptured_calls += 1
        self._warn_once(
            why,
            f"airstream: a call ran on streams without its CUDA graph: {why}. Its results are "
            "right; it is slower than a replay (said once)",
        )
        return self.inner(args)

    def _drop(self) -> None:
        """Let the captured graph and its memory go (the pool's replays are over: call with
        :meth:`CapturePool.wait_idle` done); a capture after this reuses that memory."""
        if self._graph is not None:
            self._graph.reset()  # its use of the pool ends now, not when Python collects it
        self._graph = self._static_outputs = None
        self._inputs, self._copies, self._handed_uses = [], [], []
        self.pool.set_handed(self, set())

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
        self._warned.add("blocked")  # said just now
        self._drop()

    def _outputs(self) -> tuple[Any, ...]:
        """The replay's outputs: those in the graph's memory copied out (one batched copy; an
        expanded one cloned contiguous), those handed over as fresh aliases, the others (a
        static input's memory) as they are."""
        outputs = list(self._static_outputs)
        dsts: list[torch.Tensor] = []
        srcs: list[torch.Tensor] = []
        for i in self._own:
            value = outputs[i]
            if expanded(value):
                outputs[i] = copy_like(value)
                continue
            outputs[i] = empty_strided_like(value)
            dsts.append(outputs[i])
            srcs.append(value)
        foreach_copy(dsts, srcs)
        for i in self._handed:
            outputs[i] = outputs[i].detach()  # a new alias: held by whoever keeps it
        return tuple(outputs)

    def _blocked(self, args: list[Any]) -> Any:
        self._warn_once(
            "blocked",
            "airstream: this graph is not captured into a CUDA graph (mode='reduce-overhead') "
            f"and runs on streams without capture: {'; '.join(self.blockers)}. airstream "
            "explain lists it per graph (said once)",
        )
        return self.inner(args)

    def __call__(self, args: list[Any]) -> Any:
        if self.blockers:
            return self._blocked(args)
        api, device, pool = self.api, self.device, self.pool
        with api.device(device):
            if api.capturing():  # inside the caller's own capture: issue into it
                return self.inner(args)
            with pool.lock:  # one set of buffers, one pool: its graphs replay one at a time
                if self.blockers:  # another caller reached the rerecord limit meanwhile
                    return self._blocked(args)
                moved = self._graph is not None and self._moved(args)
                if moved and self._received_elsewhere(args):
                    return self._uncaptured(
                        args, "the forward's saved tensors came from a call without its graph"
                    )
                if self._graph is not None and self._handed and self._handed_held():
                    return self._uncaptured(
                        args,
                        "the tensors its previous replay saved for the backward are still held "
                        "(a second forward before the backward, or retain_graph=True), and a "
                        "replay would overwrite them",
                    )
                if self._graph is None or moved:
                    pool.wait_idle(device)  # a replay still running uses the old memory
                    # a weight that moved counts toward the limit; saved tensors a forward of
                    # the pool handed over from elsewhere in its memory (a recaptured forward,
                    # another measured candidate's) are captured again without counting
                    if moved and self._weights_moved(args):
                        self.rerecords += 1
                        if self.rerecords > self.rerecord_limit:
                            self._stop_capturing(args)
                            return self.inner(args)
                    if moved:
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
                        self._warned.add("blocked")
                        return self.inner(args)
                return self._replay(args)

    def _replay(self, args: list[Any]) -> Any:
        """Replay the graph for this call (with the pool's lock held)."""
        api, device, pool = self.api, self.device, self.pool
        stream = api.current_stream(device)
        if stream not in self._kept_for:  # a new caller stream reads the buffers
            self._kept_for.add(stream)
            for _, buffer in self._copies:
                api.keep(buffer, stream)
        # The last replay of the pool may have been issued on another caller's stream: its reads
        # of the input buffers and its output copies come before this call's input copies.
        pool.after_last(stream, device)
        # the inputs that change, in one batched copy; weights are read in place
        foreach_copy([b for _, b in self._copies], [args[i] for i, _ in self._copies])
        args.clear()
        native = self.inner.native if self._around else None
        objects = self.inner.native_objects() if native is not None else None
        if objects is not None:
            self._around.before(objects, stream, api)
        api.replay(self._graph)
        outputs = self._outputs()
        if objects is not None:
            self._around.after(objects, stream, api)
        pool.mark_done(api, stream, device)
        return outputs


def _storage(tensor: torch.Tensor) -> int:
    """The address of ``tensor``'s storage (what aliasing tensors share)."""
    return int(tensor.untyped_storage().data_ptr())


def capture_statuses(executor: Any) -> list[str]:
    """Whether ``executor`` replays CUDA graphs, for reports: one :attr:`CudaGraphExecutor.status`
    per graph it may run (a measured executor's candidates, named), none off CUDA graphs."""
    if isinstance(executor, CudaGraphExecutor):
        return [executor.status]
    candidates = getattr(executor, "candidates", None)
    if isinstance(candidates, Mapping):
        return [f"{name}: {s}" for name, c in candidates.items() for s in capture_statuses(c)]
    return []
