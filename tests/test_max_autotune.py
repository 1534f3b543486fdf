"""mode="max-autotune": Inductor-compiled segments on every stream.

Structure (which nodes each segment fused, that no segment spans a stream or a sync, the plan
keeps its syncs) is checked next to numerics against eager. Inductor compiles C++ here: the
models are small and few.
"""

from __future__ import annotations

import logging
import operator

import pytest
import torch
from tests.conftest import assert_same, cause_of, compile_model, graph_of

import airstream
import airstream.schedule.fuse as inductor_runtime
from airstream.graph.fusion import fusible
from airstream.graph.nodes import segment_of
from airstream.schedule import overlap
from airstream.schedule.plan import Record, Wait
from plan_checks import simulate

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)


def _config(**options: object) -> airstream.CompilerConfig:
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"
    for path, value in options.items():
        group, name = path.rsplit("__", 1) if "__" in path else ("", path)
        target = config
        for part in group.split("__") if group else []:
            target = getattr(target, part)
        setattr(target, name, value)
    return config


class Branches(torch.nn.Module):
    """Two Linear + pointwise branches, one on stream "side", joined; an input mutation and two
    outputs (one a view)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with airstream.stream("side"):
            y = torch.relu(self.a(x)).sin() * 2 - 1
        z = torch.tanh(self.b(x)).cos() + 1
        buf.copy_(z * 3)
        return y * z + 0.5, z.t()


def _reference_plan(model: torch.nn.Module, *inputs: torch.Tensor):
    """The reduce-overhead compile of the same model: graph and plan before segmentation."""
    compiled, backend = compile_model(model)
    with torch.no_grad():
        compiled(*[t.clone() for t in inputs])
    torch.compiler.reset()
    return graph_of(backend, "inference")


def test_segments_never_span_a_stream_or_a_sync_and_match_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(overlap, "THREADED_NUMEL", 0)  # every op's threads matter here
    torch.manual_seed(0)
    model = Branches()
    x, buf = torch.randn(8, 32), torch.zeros(8, 32)
    ref = _reference_plan(model, x, buf)
    compiled, backend = compile_model(model, _config())
    got_buf, want_buf = buf.clone(), buf.clone()
    with torch.no_grad():
        got = compiled(x, got_buf)
        want = model(x, want_buf)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    assert_same(got_buf, want_buf, rtol=1e-5, atol=1e-5)

    graph = graph_of(backend, "inference")
    assert {s.segment.stream for s in graph.segments} == {None, "side"}
    assert all(s.node is not None and s.cache in ("miss", "hit") for s in graph.segments)
    for seg in graph.segments:
        # contiguous Runs of one stream in the unsegmented plan, no Record/Wait in between
        steps = list(ref.plan.stream(seg.segment.stream).steps)
        names = [str(step) for step in steps]
        first = names.index(f"run {seg.segment.nodes[0]}")
        window = steps[first : first + len(seg.segment.nodes)]
        assert names[first : first + len(window)] == [f"run {n}" for n in seg.segment.nodes]
        assert not any(isinstance(s, Record | Wait) for s in window)
        assert all(ref.streams.stream(n) == seg.segment.stream for n in seg.segment.nodes)
        assert any(k.startswith("cpp_fused_") for k in seg.kernels), seg.kernels
    # the plan keeps the syncs the planner proved; each segment is one step
    assert [(s.event, s.reason) for s in graph.plan.syncs] == [
        (s.event, s.reason) for s in ref.plan.syncs
    ]
    for seg in graph.segments:
        program = graph.plan.stream(seg.segment.stream)
        assert program.run_names.count(seg.node) == 1
        node = next(n for n in graph.graph_module.graph.nodes if n.name == seg.node)
        assert segment_of(node) is seg
    simulate(graph.plan)
    # the mutation of the input is inside a compiled segment
    fused = {n for s in graph.segments for n in s.segment.nodes}
    assert any(n.startswith("copy_") for n in fused)
    # kernels beside the other stream use threads_per_stream (1); after the join, every thread
    assert {s.segment.name: s.threads for s in graph.segments} == {
        "segment_main_0": 1,
        "segment_side_0": 1,
        "segment_main_1": 0,
    }
    assert "(1 thread)" in graph.segments[0].describe()


def test_kernels_run_on_their_streams_in_the_profile() -> None:
    model = Branches()
    x, buf = torch.randn(8, 32), torch.zeros(8, 32)
    compiled, backend = compile_model(model, _config())
    with torch.no_grad():
        compiled(x, buf)
        with airstream.profile() as prof:
            compiled(x, buf)
    graph = graph_of(backend, "inference")
    by_stream = {(r.stream, r.name): r.detail for r in prof.events if r.detail}
    for seg in graph.segments:
        assert by_stream[(seg.segment.stream, seg.node)] == seg.describe()
    assert "segments (max-autotune)" in prof.summary()
    trace = prof.chrome_trace()["traceEvents"]
    assert any("segment" in e.get("args", {}) for e in trace)


def test_dynamic_shapes_training_and_rng_match_eager() -> None:
    torch.manual_seed(0)

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 16)
            self.b = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("side"):
                y = torch.relu(self.a(x)).sin() * 2
            z = torch.nn.functional.dropout(torch.tanh(self.b(x)), 0.3, training=True) + 1
            return (y + z).sum(1)

    model = Model()
    compiled, backend = compile_model(model, _config(), dynamic=True)
    for rows in (4, 7):
        x = torch.randn(rows, 16)
        torch.manual_seed(1)
        with torch.no_grad():
            got = compiled(x)
        torch.manual_seed(1)
        with torch.no_grad():
            want = model(x)
        assert_same(got, want, rtol=1e-5, atol=1e-5)  # dropout's mask is eager's bit for bit
    graph = graph_of(backend, "inference")
    fused = {n for s in graph.segments for n in s.segment.nodes}
    by_name = {n.name: n for n in graph.graph_module.graph.nodes}
    rng = [n for n in by_name.values() if "native_dropout" in str(n.target)]
    assert rng and not {n.name for n in rng} & fused, "random ops stay out of segments"

    # training: gradients equal eager's over two steps
    torch.compiler.reset()
    compiled, backend = compile_model(model, _config())
    eager = Model()
    eager.load_state_dict(model.state_dict())
    for step in range(2):
        x = torch.randn(6, 16)
        torch.manual_seed(step)
        compiled(x).sum().backward()
        torch.manual_seed(step)
        eager(x).sum().backward()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        assert_same(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    kinds = {g.kind: g for g in backend.graphs}
    assert kinds["forward"].segments and kinds["backward"].segments


class Experts(torch.nn.Module):
    """Two identical expert blocks on two streams: one compile serves both."""

    def __init__(self) -> None:
        super().__init__()
        self.e0 = torch.nn.Linear(16, 16)
        self.e1 = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("e0"):
            a = torch.nn.functional.gelu(self.e0(x)) * 2
        with airstream.stream("e1"):
            b = torch.nn.functional.gelu(self.e1(x)) * 2
        return a + b


def test_identical_segments_compile_once() -> None:
    model = Experts()
    x = torch.randn(4, 16)
    compiled, backend = compile_model(model, _config())
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    segs = {s.segment.stream: s for s in graph_of(backend, "inference").segments}
    assert {segs["e0"].cache, segs["e1"].cache} >= {"shared"}
    assert segs["e0"].kernels == segs["e1"].kernels


def test_a_failing_segment_falls_back_to_aten_with_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = inductor_runtime._compile

    def flaky(sub, *args):
        if any("relu" in str(n.target) for n in sub.graph.nodes):
            raise RuntimeError("forced failure for the test")
        return real(sub, *args)

    monkeypatch.setattr(inductor_runtime, "_compile", flaky)
    model = Branches()
    x, buf = torch.randn(8, 32), torch.zeros(8, 32)
    compiled, backend = compile_model(model, _config())
    with caplog.at_level(logging.WARNING, logger="airstream"), torch.no_grad():
        got_buf, want_buf = buf.clone(), buf.clone()
        got = compiled(x, got_buf)
        compiled(x, got_buf)  # a second call logs nothing more
        want = model(x, want_buf)
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    assert_same(got_buf, want_buf, rtol=1e-5, atol=1e-5)
    lines = [r.getMessage() for r in caplog.records if "runs as aten code" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "segment_side_0" in lines[0] and "relu" in lines[0]
    assert "forced failure for the test" in lines[0]
    graph = graph_of(backend, "inference")
    fallback = [s for s in graph.segments if s.node is None]
    assert [s.segment.stream for s in fallback] == ["side"]
    assert fallback[0].cache == "fallback"
    # the fallen-back segment's nodes are still plain aten nodes on their stream
    names = {n.name for n in graph.graph_module.graph.nodes}
    assert set(fallback[0].segment.nodes) <= names
    assert all(graph.streams.stream(n) == "side" for n in fallback[0].segment.nodes)
    # the other segments were compiled
    assert any(s.node is not None for s in graph.segments)


def test_strict_mode_makes_a_failing_segment_a_pass_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("forced failure for the test")

    monkeypatch.setattr(inductor_runtime, "_compile", broken)
    compiled, _ = compile_model(Branches(), _config(debug__strict_max_autotune=True))
    with pytest.raises(Exception) as info, torch.no_grad():
        compiled(torch.randn(8, 32), torch.zeros(8, 32))
    error = cause_of(info.value, airstream.PassError)
    assert isinstance(error, airstream.PassError), repr(info.value)
    assert error.stage == "max-autotune" and error.pass_name.startswith("segment_")
    assert "forced failure for the test" in str(error)
    assert "strict_max_autotune" in str(error)


def test_min_segment_ops_keeps_single_ops_as_aten() -> None:
    def one_op(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x)

    compiled, backend = compile_model(one_op, _config())
    x = torch.randn(5)
    assert_same(compiled(x), torch.sin(x))
    assert graph_of(backend, "inference").segments == ()
    torch.compiler.reset()
    compiled, backend = compile_model(one_op, _config(experimental_config__min_segment_ops=1))
    assert_same(compiled(x), torch.sin(x), rtol=1e-6, atol=1e-6)
    (seg,) = graph_of(backend, "inference").segments
    assert seg.segment.nodes == ("sin",)


def test_fusible_rules() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2)
    sin = graph.call_function(torch.ops.aten.sin.default, (x,))
    sin.meta["val"] = torch.empty(2)
    rand = graph.call_function(torch.ops.aten.rand_like.default, (x,))
    rand.meta["val"] = torch.empty(2)
    add_ = graph.call_function(torch.ops.aten.add_.Tensor, (sin, x))
    add_.meta["val"] = torch.empty(2)
    copy_ = graph.call_function(torch.ops.aten.copy_.default, (x, sin))
    copy_.meta["val"] = torch.empty(2)
    item = graph.call_function(operator.getitem, (sin, 0))
    assert fusible(sin, frozenset())
    assert not fusible(rand, frozenset()), "random ops keep eager's generator order"
    assert not fusible(add_, frozenset()), "in-place ops on intermediates stay aten"
    assert fusible(copy_, frozenset()), "copy_ into a graph input is an input mutation"
    assert not fusible(item, frozenset()) and fusible(item, frozenset({sin}))


def test_dumps_and_explain_show_segments(tmp_path: object) -> None:
    config = _config()
    config.debug.graph_dump.type = "txt"
    config.debug.graph_dump.path = str(tmp_path)
    compiled, backend = compile_model(Branches(), config)
    with torch.no_grad():
        compiled(torch.randn(8, 32), torch.zeros(8, 32))
    written = backend.dumpers[0].written
    summary = open(next(p for p in written if p.endswith("inference_summary.txt"))).read()
    graph = graph_of(backend, "inference")
    for seg in graph.segments:
        assert seg.segment.name in summary and seg.kernels[0] in summary
    plan_dump = open(next(p for p in written if p.endswith("inference_plan.txt"))).read()
    assert "inductor_segment" in plan_dump and "# fused" in plan_dump

    from airstream.debug.dot import to_dot

    dot = to_dot(graph.graph_module, graph.streams, graph.plan)
    seg = graph.segments[0]
    assert "peripheries" in dot and seg.kernels[0] in dot

    torch.compiler.reset()
    report = str(
        airstream.explain(
            Branches(), torch.randn(8, 32), torch.zeros(8, 32), compiler_config=_config()
        )
    )
    assert "max-autotune segments" in report and "compile s" in report
    assert "segment_side_0" in report


def test_a_second_compile_reuses_inductors_cache() -> None:
    """Inductor's FX graph cache (on disk, keyed by the segment's graph): what a later process
    reuses too."""
    x, buf = torch.randn(8, 32), torch.zeros(8, 32)
    model = Branches()
    compiled, _ = compile_model(model, _config())
    with torch.no_grad():
        compiled(x, buf.clone())
    torch.compiler.reset()
    compiled, backend = compile_model(model, _config())
    with torch.no_grad():
        compiled(x, buf.clone())
    segments = graph_of(backend, "inference").segments
    assert segments and {s.cache for s in segments} == {"hit"}


def test_segment_outputs_keep_their_recorded_strides() -> None:
    """Inductor prefers channels-last after a convolution; a segment's outputs are read by code
    compiled for the recorded strides (here a view on the main stream), so they keep them."""

    class Conv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with airstream.stream("side"):
                y = self.conv(x.unsqueeze(0))
            return y.squeeze(0).reshape(4, -1).sum(1) * 2

    model = Conv()
    x = torch.randn(3, 5, 5)
    compiled, backend = compile_model(model, _config())
    with torch.no_grad():
        assert_same(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    segments = graph_of(backend, "inference").segments
    assert any("convolution" in " ".join(s.kernels) for s in segments)


def test_a_wait_between_segment_members_still_follows_its_value() -> None:
    """Found by the fuzzer: a wait on a same-stream tensor is no sync, so the segment spans it,
    and the wait, which reads a member, must still come after the fused node in the graph."""

    def model(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("s"):
            a = x.sin()
            airstream.ops.wait([a])
            b = (a * 2).cos()
        return b + 1

    x = torch.randn(6)
    compiled, backend = compile_model(model, _config())
    assert_same(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    (seg,) = [s for s in graph.segments if s.segment.stream == "s"]
    assert seg.segment.ops >= 3


def test_a_constant_tensor_inside_a_segment_is_defined_before_the_fused_node() -> None:
    """Issue 16, class 1: transformers' DynamicCache makes `torch.tensor([])`; the get_attr
    constant sat inside a segment after the fused node's insertion point ("used before it has
    been defined") in every decoder with a KV cache."""

    def model(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() + 1) * torch.tensor([1.0, 2.0])

    compiled, backend = compile_model(model, _config(experimental_config__min_segment_ops=1))
    x = torch.randn(2)
    assert_same(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    graph = graph_of(backend, "inference")
    assert graph.segments and graph.fallbacks == 0


def test_a_computed_int_input_compiles_with_the_graph_cache_warm() -> None:
    # x arrives as s0*s1 (it must equal z's size); Inductor's FX graph cache cannot check its
    # guards for such an input (KeyError on a Dynamo source name): compiled uncached, twice
    class Pack(torch.nn.Module):
        def forward(self, x: int, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
            return z.view([x]) + y.view([x, 1]) + x

    for _ in range(2):  # the second compile finds the first one's entry in the cache
        torch.compiler.reset()
        compiled, backend = compile_model(
            Pack(), _config(debug__strict_max_autotune=True), dynamic=True
        )
        y, z = torch.randn(2, 3), torch.randn(3, 2)
        assert_same(compiled(6, y, z), Pack()(6, y, z))
        assert graph_of(backend, "inference").segments


@torch.library.custom_op("airstream_fused::scale_into", mutates_args=("out",))
def _scale_into(out: torch.Tensor, x: torch.Tensor, factor: float) -> None:
    """An ``out=`` op as vLLM writes them: the result goes into a buffer the caller made."""
    torch.mul(x, factor, out=out)


@_scale_into.register_fake
def _(out: torch.Tensor, x: torch.Tensor, factor: float) -> None:
    return None


@torch.library.custom_op("airstream_fused::gelu_of", mutates_args=())
def _gelu_of(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x)


@_gelu_of.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class _CustomOps(torch.nn.Module):
    """Pointwise work around an ``out=`` custom op writing a fresh buffer and a slice of one,
    and a custom op writing nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.airstream_fused.scale_into(out, x.sin(), 2.0)
        both = torch.empty(x.shape[0], 2 * x.shape[1])
        torch.ops.airstream_fused.scale_into(both[:, : x.shape[1]], out.cos(), 3.0)
        return torch.ops.airstream_fused.gelu_of(out + 1) + both[:, : x.shape[1]]


@pytest.mark.parametrize("reinplace", [False, True])
def test_custom_ops_and_their_out_writes_are_fused_into_one_segment(reinplace: bool) -> None:
    """vLLM's graphs: in max-autotune one Inductor compile holds its ops between the streams'
    syncs, as Inductor's own whole-graph compile would (airstream's reinplace leaves the
    ``auto_functionalized_v2`` calls to Inductor there)."""
    config = _config(experimental_config__reinplace_input_mutations=reinplace)
    compiled, backend = compile_model(_CustomOps(), config)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert_same(compiled(x), _CustomOps()(x), rtol=1e-6, atol=1e-6)
    graph = graph_of(backend, "inference")
    (segment,) = graph.segments
    assert segment.node is not None and not segment.fallback
    members = {str(n.target) for n in segment.segment.members}
    assert "airstream_fused.gelu_of.default" in members
    calls = [n for n in segment.segment.members if "auto_functionalized" in str(n.target)]
    assert len(calls) == 2


def test_fusible_takes_other_libraries_ops_that_write_nothing_and_functionalized_calls() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(2)
    gelu = graph.call_function(torch.ops.airstream_fused.gelu_of.default, (x,))
    gelu.meta["val"] = torch.empty(2)
    record = graph.call_function(torch.ops.air.record.default, ())
    record.meta["val"] = torch.empty(2)
    assert fusible(gelu, frozenset())
    assert not fusible(record, frozenset()), "airstream's own ops are steps of their own"
