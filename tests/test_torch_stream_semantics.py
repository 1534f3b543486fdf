"""What torch's own stream tests check, checked on airstream's streams.

torch's ``test/dynamo/test_streams.py`` (how Dynamo records stream blocks, events and
``wait_stream``: enter/exit, nesting, streams passed in or made inside, mutation, backward) and
``test/inductor/test_user_streams.py`` (whether a compiled program of streams and events gives
eager's results, whatever its shape: pipelines, fan-out and fan-in, diamonds, loops; no fusion
across streams) run on CUDA. These are the same checks in airstream's words, on CPU (each
``torch.Stream`` a real stream of airstream's runtime), and on a GPU where there is one.

The eager reference runs the same program: on CPU with airstream's ``CpuStream``/``CpuEvent``,
whose calls order nothing because eager CPU code runs in program order; on CUDA with CUDA
streams and events. Every program passes the caller's stream explicitly where torch's take the
implicit current stream, which Dynamo cannot name on a machine without an accelerator.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of, ops_by_stream, slow

import airstream
from airstream.ops.torch_streams import CpuEvent, CpuStream

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

aten = torch.ops.aten


def _objects(device: str) -> types.SimpleNamespace:
    if device == "cuda":
        streams = [torch.cuda.Stream() for _ in range(3)]
        events = [torch.cuda.Event() for _ in range(3)]
        main = torch.cuda.current_stream()
    else:
        streams = [CpuStream() for _ in range(3)]
        events = [CpuEvent() for _ in range(3)]
        main = airstream.current_stream("cpu")
    return types.SimpleNamespace(
        main=main,
        s1=streams[0],
        s2=streams[1],
        s3=streams[2],
        e1=events[0],
        e2=events[1],
        e3=events[2],
    )


# Each program: (x, w, o) -> tensor(s); o holds the streams and events.


def _blocks_then_synchronize(x: Any, w: Any, o: Any) -> Any:
    a = x + 1
    with o.s1:
        b = x * 2
    with o.s2:
        c = x * 3
    o.s1.synchronize()
    o.s2.synchronize()
    return a + b + c


def _nested_blocks(x: Any, w: Any, o: Any) -> Any:
    with o.s1:
        with o.s2:
            z1 = x + w  # the inner block
        with o.s3:
            z0 = x - w
        with o.s2:
            y = z1 * 2
    return z0, y


def _event_recorded_on_a_stream(x: Any, w: Any, o: Any) -> Any:
    with o.s1:
        a = x * 2
    o.e1.record(o.s1)
    with o.s2:
        o.e1.wait(o.s2)
        b = a + 1
    o.main.wait_stream(o.s2)
    return b


def _three_stream_pipeline(x: Any, w: Any, o: Any) -> Any:
    with o.s1:
        a = x @ w
        o.e1.record()
    with o.s2:
        o.e1.wait()
        b = a @ w
        o.e2.record()
    with o.s3:
        o.e2.wait()
        c = b @ w
    o.main.wait_stream(o.s3)
    return c


def _fan_out_fan_in(x: Any, w: Any, o: Any) -> Any:
    a = x * 2
    o.e3.record(o.main)
    with o.s1:
        o.e3.wait()
        b = a + 1
        o.e1.record()
    with o.s2:
        o.e3.wait()
        c = a + 2
        o.e2.record()
    o.e1.wait(o.main)
    o.e2.wait(o.main)
    return b * c


def _diamond(x: Any, w: Any, o: Any) -> Any:
    base = x @ w
    o.s1.wait_stream(o.main)
    o.s2.wait_stream(o.main)
    with o.s1:
        left = (base.relu() @ w).relu()
        o.e1.record()
    with o.s2:
        right = (base.sigmoid() @ w).sigmoid()
        o.e2.record()
    with o.s3:
        o.e1.wait()
        o.e2.wait()
        joined = left + right
    o.main.wait_stream(o.s3)
    return joined


def _ping_pong(x: Any, w: Any, o: Any) -> Any:
    with o.s1:
        a = x @ w
        o.e1.record()
    with o.s2:
        o.e1.wait()
        b = a @ w
        o.e2.record()
    with o.s1:
        o.e2.wait()
        c = b + a
    o.main.wait_stream(o.s1)
    return c


def _stream_reused_in_a_loop(x: Any, w: Any, o: Any) -> Any:
    r = x
    for _ in range(3):
        with o.s1:
            r = r * 2
            o.e1.record()
        o.e1.wait(o.main)
        r = r + 1
    return r


def _wait_stream_between_blocks(x: Any, w: Any, o: Any) -> Any:
    with o.s1:
        a = x + 1
    o.s2.wait_stream(o.s1)
    with o.s2:
        b = a * 2
    o.main.wait_stream(o.s2)
    return b


def _mutation_across_streams(x: Any, w: Any, o: Any) -> Any:
    with o.s1:
        x.add_(w)
    o.s2.wait_stream(o.s1)
    with o.s2:
        z = x * 2
    return z


PROGRAMS: dict[str, tuple[Callable[..., Any], dict[Any, list[str | None]]]] = {
    # name: (program, {op: the stream of each of its nodes, in order})
    "blocks_then_synchronize": (
        _blocks_then_synchronize,
        {aten.mul.Tensor: ["s1", "s2"], aten.add.Tensor: [None, None, None]},
    ),
    "nested_blocks": (
        _nested_blocks,
        {aten.add.Tensor: ["s2"], aten.sub.Tensor: ["s3"], aten.mul.Tensor: ["s2"]},
    ),
    "event_recorded_on_a_stream": (
        _event_recorded_on_a_stream,
        {aten.mul.Tensor: ["s1"], aten.add.Tensor: ["s2"]},
    ),
    "three_stream_pipeline": (_three_stream_pipeline, {aten.mm.default: ["s1", "s2", "s3"]}),
    "fan_out_fan_in": (_fan_out_fan_in, {aten.add.Tensor: ["s1", "s2"]}),
    "diamond": (_diamond, {aten.mm.default: [None, "s1", "s2"], aten.add.Tensor: ["s3"]}),
    "ping_pong": (_ping_pong, {aten.mm.default: ["s1", "s2"], aten.add.Tensor: ["s1"]}),
    "stream_reused_in_a_loop": (
        _stream_reused_in_a_loop,
        {aten.mul.Tensor: ["s1"] * 3, aten.add.Tensor: [None] * 3},
    ),
    "wait_stream_between_blocks": (
        _wait_stream_between_blocks,
        {aten.add.Tensor: ["s1"], aten.mul.Tensor: ["s2"]},
    ),
}


# the default set's programs in the default mode (the rest are slow): two streams joined, three
# in a pipeline, a wait_stream between blocks
_DEFAULT_MODE_SET = {"diamond", "three_stream_pipeline", "wait_stream_between_blocks"}


def _streams_of(graph: Any, op: Any) -> list[str | None]:
    return [graph.streams.stream(n) for n in graph.graph_module.graph.nodes if n.target is op]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_stream_program_gives_eagers_result_on_the_streams_it_names(name: str) -> None:
    program, expected = PROGRAMS[name]
    o = _objects("cpu")
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    want = program(x.clone(), w.clone(), o)
    compiled, backend = compile_model(program, fullgraph=True)
    with torch.no_grad():
        assert_same(compiled(x.clone(), w.clone(), o), want, rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    labels = {None: None, "s1": "s1", "s2": "s2", "s3": "s3"}  # each object: its attribute
    for op, streams in expected.items():
        want_streams = [labels[s] for s in streams]
        assert _streams_of(graph, op) == want_streams, (op, dict(graph.streams.stream_of))


@pytest.mark.parametrize(
    "name",
    [
        name
        if name in _DEFAULT_MODE_SET
        else pytest.param(
            name,
            marks=slow(
                "Inductor segments per program",
                "tests/test_torch_stream_semantics.py::"
                "test_a_stream_program_gives_eagers_result_in_the_default_mode",
            ),
        )
        for name in sorted(PROGRAMS)
    ],
)
def test_a_stream_program_gives_eagers_result_in_the_default_mode(
    name: str, default_mode: None
) -> None:
    """The same programs as users compile them: Inductor segments on each stream, each op on
    the stream its block names."""
    program, expected = PROGRAMS[name]
    o = _objects("cpu")
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    want = program(x.clone(), w.clone(), o)
    compiled, backend = compile_model(program, fullgraph=True)
    with torch.no_grad():
        assert_same(compiled(x.clone(), w.clone(), o), want, rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    assert graph.mode == "max-autotune" and graph.fallbacks == 0
    counts = ops_by_stream(graph)
    for op, streams in expected.items():
        for stream in set(streams):
            assert counts.get((op, stream), 0) == streams.count(stream), (op, stream, counts)


def test_streams_passed_in_are_named_by_their_parameter_and_the_innermost_block_wins() -> None:
    """torch's enter/exit tests pass the streams as inputs: each is its own stream."""

    def f(x: torch.Tensor, y: torch.Tensor, first: torch.Stream, second: torch.Stream) -> Any:
        with first:
            z1 = x + y
        with second:
            z = x * y
            with first:
                inner = z + 2
            y = inner + z1
        return y

    one, two = CpuStream(), CpuStream()
    compiled, backend = compile_model(f, fullgraph=True)
    x, y = torch.randn(4), torch.randn(4)
    with torch.no_grad():
        assert_same(compiled(x, y, one, two), f(x, y, one, two))
    graph = graph_of(backend, "inference")
    assert _streams_of(graph, aten.add.Tensor) == ["first", "first", "second"]
    assert _streams_of(graph, aten.mul.Tensor) == ["second"]


def test_a_stream_made_inside_and_returned_is_a_new_stream_each_call() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Stream]:
        s = torch.Stream(device="cpu")
        with s:
            y = x + 2
        return y, s

    compiled, _ = compile_model(f, fullgraph=True)
    with torch.no_grad():
        (a, first), (_, second) = compiled(torch.ones(2)), compiled(torch.ones(2))
    assert isinstance(first, torch.Stream) and first is not second
    assert_same(a, torch.full((2,), 3.0))


def test_an_input_mutated_on_one_stream_is_read_after_it_on_another() -> None:
    program = _mutation_across_streams
    o = _objects("cpu")
    x, w = torch.randn(8), torch.randn(8)
    eager_x = x.clone()
    want = program(eager_x, w, o)
    compiled, backend = compile_model(program, fullgraph=True)
    mine = x.clone()
    with torch.no_grad():
        assert_same(compiled(mine, w, o), want)
    assert_same(mine, eager_x)  # the input was written as in eager
    graph = graph_of(backend, "inference")
    assert _streams_of(graph, aten.mul.Tensor) == ["s2"]


def test_an_event_keeps_its_place_before_a_mutation() -> None:
    """torch's event-tracing test: the record comes before the mutation in the graph."""
    o = _objects("cpu")

    def f(x: torch.Tensor) -> torch.Tensor:
        with o.s1:
            y = x * 3
            o.e1.record()
        x.add_(1)
        o.e1.wait(o.main)
        return x + y

    x = torch.randn(4)
    want_x = x.clone()
    want = f(want_x)
    compiled, backend = compile_model(f, fullgraph=True)
    got_x = x.clone()
    with torch.no_grad():
        assert_same(compiled(got_x), want)
    assert_same(got_x, want_x)
    nodes = list(graph_of(backend, "inference").graph_module.graph.nodes)
    record = next(i for i, n in enumerate(nodes) if n.target is torch.ops.air.record.default)
    mutation = next(i for i, n in enumerate(nodes) if n.target is aten.add.Tensor)
    assert record < mutation


def test_backward_through_blocks_on_two_streams_gives_eagers_gradients() -> None:
    """torch's simple backward test: a value made on one block's stream read on another."""

    def f(x: torch.Tensor, y: torch.Tensor, o: Any) -> torch.Tensor:
        with o.s2:
            y0 = 2 * x + y
        with o.s1:
            z = 2 * x + y
        return (y0 * z).sum()

    o = _objects("cpu")
    x, y = torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True)
    x2, y2 = (t.detach().clone().requires_grad_() for t in (x, y))
    compiled, backend = compile_model(f)
    compiled(x, y, o).backward()
    f(x2, y2, o).backward()
    assert_same([x.grad, y.grad], [x2.grad, y2.grad], rtol=1e-6, atol=1e-6)
    backward = graph_of(backend, "backward")
    assert {"s1", "s2"} <= set(backward.streams.side_streams)


def test_max_autotune_fuses_within_a_stream_never_across() -> None:
    """Inductor's user-stream tests: kernels of two streams are never fused together."""
    o = _objects("cpu")

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with o.s1:
            a = (x * 2 + 1).sin() * 3
        with o.s2:
            b = (x * 4 + 2).cos() * 5
        return a + b

    compiled, backend = compile_model(f, mode="max-autotune", fullgraph=True)
    x = torch.randn(16)
    with torch.no_grad():
        assert_same(compiled(x, x), f(x, x), rtol=1e-5, atol=1e-5)
    graph = graph_of(backend, "inference")
    fused = {s.segment.stream: set(s.segment.nodes) for s in graph.segments}
    assert {"s1", "s2"} <= set(fused), fused  # each stream's pointwise run: one segment
    assert "sin" in fused["s1"] and "cos" in fused["s2"]
    assert not fused["s1"] & fused["s2"]


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_cuda_a_stream_program_gives_eagers_result(name: str) -> None:
    program, _ = PROGRAMS[name]
    o = _objects("cuda")
    x, w = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    want = program(x.clone(), w.clone(), o)
    torch.cuda.synchronize()
    compiled, _ = compile_model(program, fullgraph=True)
    with torch.no_grad():
        got = compiled(x.clone(), w.clone(), o)
    torch.cuda.synchronize()
    assert_same(got, want, rtol=1e-4, atol=1e-4)
