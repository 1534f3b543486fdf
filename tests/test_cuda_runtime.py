"""CUDA runtime: generated code checked on CPU (text, and a run with stand-in streams and
events); real execution tests are marked ``cuda`` and skip without a GPU."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of
from torch.fx.experimental.proxy_tensor import make_fx

import airstream
from airstream import torch_internals
from airstream.examples.guide import Model, custom_pre_pass
from airstream.runtime.cuda import CudaExecutor, CudaGraphExecutor, capture_blockers
from airstream.schedule import assign_streams
from airstream.schedule.plan import build_plan

air = torch.ops.air
LABEL = "_user_stream_label"


def _two_streams(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    air.scope_enter([LABEL, "_user_stream_priority"], ["side", "-1"])
    a = torch.mm(x, w).relu()
    air.scope_exit()
    b = torch.mm(w, x).sigmoid()
    return a + b, a


def _executor(fn: Any, *args: torch.Tensor) -> tuple[CudaExecutor, torch.fx.GraphModule]:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    plan = build_plan(gm, assign_streams(gm))
    return CudaExecutor(gm, plan, torch.device("cuda", 0)), gm


def test_generated_code_forks_switches_syncs_and_joins() -> None:
    executor, _ = _executor(_two_streams, torch.randn(4, 4), torch.randn(4, 4))
    code = executor.code
    lines = [line.strip() for line in code.splitlines() if line.strip()]
    text = "\n".join(lines)
    assert "_fork(streams, events, 1)" in text  # fork event after the one sync event
    assert "_use(streams, 1)" in text and "_use(streams, 0)" in text
    assert "_record(streams, 1, events, 0)" in text and "_wait(streams, 0, events, 0)" in text
    # inputs used on the side stream, and side results used on main, are kept for the consumer
    assert text.count("_keep(") >= 3
    order = [i for i, line in enumerate(lines) if "_record(" in line or "_wait(" in line]
    assert "_record" in lines[order[0]], "the record is issued before the wait"


def test_a_stream_that_runs_nothing_is_neither_forked_nor_waited_on() -> None:
    """Forked and never joined, such a stream would make a CUDA graph capture fail."""

    def marks_only(x: torch.Tensor) -> torch.Tensor:
        air.scope_enter([LABEL], ["idle"])
        token = air.record()  # nothing runs on "idle": the token is a position
        air.scope_exit()
        air.wait([token])
        return x.sin()

    executor, _ = _executor(marks_only, torch.randn(4))
    assert "_fork" not in executor.code and "_wait(" not in executor.code
    assert executor._sides_used == [] and "sin" in executor.code


class _Stand:
    """Stand-in for torch.cuda.Stream / Event that logs what is issued."""

    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        self.name, self.log = name, log

    def wait_event(self, event: _Stand) -> None:
        self.log.append(("wait", self.name, event.name))

    def record(self, stream: _Stand) -> None:
        self.log.append(("record", stream.name, self.name))


def test_generated_code_runs_with_stand_in_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    executor, _ = _executor(_two_streams, x, w)
    log: list[tuple[str, ...]] = []
    monkeypatch.setattr(torch.cuda, "set_stream", lambda s: log.append(("use", s.name)))
    streams = [_Stand("main", log), _Stand("side", log)]
    events = [_Stand(f"e{i}", log) for i in range(executor._num_events)]
    out = executor._fn([x, w], streams, events, True)
    assert_same(out, _two_streams(x, w))
    assert log[0] == ("record", "main", "e1") and log[1] == ("wait", "side", "e1")  # fork
    uses = [entry for entry in log if entry[0] == "use"]
    assert uses == [("use", "side"), ("use", "main")], "switched to the side and back"
    recorded: set[str] = set()
    for entry in log:
        if entry[0] == "record":
            recorded.add(entry[2])
        elif entry[0] == "wait":
            assert entry[2] in recorded, f"{entry} waits for an event not yet recorded"


def test_capture_blockers() -> None:
    _, gm = _executor(_two_streams, torch.randn(4, 4), torch.randn(4, 4))
    assert any("is on cpu" in r for r in capture_blockers(gm))

    def mutating(x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return torch.rand(2) + x.sum()

    gm = make_fx(mutating, tracing_mode="fake")(torch.randn(2))
    reasons = " ".join(capture_blockers(gm))
    assert "mutates its input" in reasons and "draws random numbers" in reasons


def test_priority_reaches_the_plan() -> None:
    executor, _ = _executor(_two_streams, torch.randn(4, 4), torch.randn(4, 4))
    assert executor.plan.priorities == {"side": -1}


# ---- on a GPU -----------------------------------------------------------------------------


class _StandInGraph:
    """A CUDA graph stand-in: replay re-runs what was captured on the captured tensors."""

    def __init__(self) -> None:
        self.replays: list[Any] = []

    def replay(self) -> None:
        for fn in self.replays:
            fn()


class _StandInApi:
    def __init__(self) -> None:
        self.capturing: _StandInGraph | None = None

    def graph(self) -> _StandInGraph:
        return _StandInGraph()

    @contextlib.contextmanager
    def capture(self, graph: _StandInGraph) -> Any:
        self.capturing = graph
        try:
            yield
        finally:
            self.capturing = None

    def warmup_stream(self, device: torch.device) -> Any:
        return contextlib.nullcontext()


class _StandInInner:
    """Computes ``x @ w`` like a CudaExecutor would; under capture, records a replay that reads
    the captured tensors by address and writes the captured output in place."""

    device = torch.device("cpu")
    code = "x @ w"

    def __init__(self, api: _StandInApi) -> None:
        self.api = api
        self.runs = 0

    def run(self, args: list[Any], tracking: bool = True) -> Any:
        x, w = args
        args.clear()
        self.runs += 1
        out = x @ w
        graph = self.api.capturing
        if graph is not None:
            graph.replays.append(lambda: out.copy_(x @ w))
        return (out,)

    def __call__(self, args: list[Any]) -> Any:
        return self.run(args)


def test_cuda_graph_captures_weights_by_address_and_copies_only_inputs() -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 3)
    gm = make_fx(lambda x, w: x @ w, tracing_mode="fake")(x, w)
    api = _StandInApi()
    inner = _StandInInner(api)
    executor = CudaGraphExecutor(inner, gm, static=(1,), warmup=2, api=api)
    executor.blockers = []  # CPU tensors would block capture; the bookkeeping is what is tested
    args = [x, w]
    assert_same(executor(args), (x @ w,))
    assert args == [], "the boxed convention: the argument list is emptied"
    assert executor.captures == 1 and inner.runs == 3  # 2 warm-up runs, 1 capture
    assert executor._inputs[1] is w, "the weight is captured by address, not cloned"
    assert executor._inputs[0] is not x, "the input is copied into the graph's own buffer"
    x2 = torch.randn(4, 8)
    assert_same(executor([x2, w]), (x2 @ w,))
    assert executor.captures == 1 and inner.runs == 3, "a replay runs nothing again"
    with torch.no_grad():
        w.add_(1.0)  # updated in place (an optimizer step): the replay reads the new values
    assert_same(executor([x2, w]), (x2 @ w,))
    w_new = torch.randn(8, 3)  # a different tensor (load_state_dict with assign=True)
    assert_same(executor([x2, w_new]), (x2 @ w_new,))
    assert executor.captures == 2 and executor._inputs[1] is w_new


def test_static_inputs_are_the_parameters_and_buffers() -> None:
    seen: list[Any] = []

    def compiler(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        seen.append(torch_internals.static_input_indices())
        seen.append([tuple(i.shape) for i in inputs])
        return airstream.get_compiler()(gm, inputs)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).eval()
    backend = torch_internals.aot_autograd(fw_compiler=compiler)
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(3, 4)
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    static, shapes = seen[0], seen[1]
    assert static is not None
    # Linear's weight and bias, BatchNorm's weight, bias, running mean and variance, and its
    # step counter: static; the one input that is not is x
    dynamic = [i for i in range(len(shapes)) if i not in static]
    assert len(dynamic) == 1 and shapes[dynamic[0]] == (3, 4), (static, shapes)


@pytest.mark.cuda
def test_cuda_guide_example_matches_eager() -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = custom_pre_pass
    compiled, backend = compile_model(Model().cuda(), config)
    for _ in range(20):
        x = torch.randn(64, 64, device="cuda")
        assert_same(compiled(x), Model()(x), rtol=1e-5, atol=1e-5)
    executor = graph_of(backend, "inference").executor
    assert isinstance(executor, CudaGraphExecutor) and not executor.blockers


@pytest.mark.cuda
def test_cuda_streams_without_graphs_and_outputs_do_not_alias() -> None:
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"  # no CUDA graph: the stream executor, with Triton segments
    config.experimental_config.min_segment_ops = 1
    w = torch.randn(256, 256, device="cuda")
    compiled, backend = compile_model(lambda x: _two_streams(x, w), config)
    first = compiled(torch.randn(256, 256, device="cuda"))
    graph = graph_of(backend, "inference")
    assert isinstance(graph.executor, CudaExecutor)
    assert graph.segments and all(s.node is not None for s in graph.segments)
    x = torch.randn(256, 256, device="cuda")
    assert_same(compiled(x), _two_streams(x, w), rtol=1e-4, atol=1e-4)
    assert first[0].data_ptr() != compiled(x)[0].data_ptr()


@pytest.mark.cuda
def test_cuda_graph_replay_outputs_are_fresh() -> None:
    w = torch.randn(128, 128, device="cuda")
    compiled, _ = compile_model(lambda x: _two_streams(x, w))
    x1, x2 = torch.randn(128, 128, device="cuda"), torch.randn(128, 128, device="cuda")
    out1 = compiled(x1)
    keep = out1[0].clone()
    out2 = compiled(x2)
    assert_same(out1[0], keep)  # the second replay did not overwrite the first result
    assert_same(out2, _two_streams(x2, w), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_training_with_streams_matches_eager() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("side"):
                left = self.a(x).relu()
            return (left * self.b(x).tanh()).sum()

    net = Net().cuda()
    ref = Net().cuda()
    ref.load_state_dict(net.state_dict())
    compiled, _ = compile_model(net)
    x = torch.randn(16, 32, device="cuda")
    compiled(x).backward()
    ref(x).backward()
    for p, q in zip(net.parameters(), ref.parameters(), strict=True):
        assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-5)
