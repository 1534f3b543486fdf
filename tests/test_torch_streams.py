"""PyTorch's own stream IR in model code: ``with torch.Stream``, ``torch.Event`` and
``wait_stream`` run on airstream's streams (CPU), forward and backward, on every torch in range.

Each test pairs structure (which node runs on which stream, the syncs the plan made of the
native ops) with numerics against the same model without streams (eager CPU PyTorch cannot run
``wait_stream`` or ``Event.record``: "cpu backend doesn't support events").
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of, slow

import airstream
from airstream import passes, torch_internals
from airstream.backend import CompiledGraph
from airstream.errors import StreamError
from airstream.ops.library import record, wait
from airstream.ops.torch_streams import NATIVE_OPS

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

aten = torch.ops.aten
TORCH = torch_internals.torch_release()[:2]

side = torch.Stream(device="cpu")
other = torch.Stream(device="cpu")
done = torch.Event(device="cpu")


def _on(graph: CompiledGraph, target: Any) -> list[str | None]:
    """The streams of the nodes calling ``target``, in graph order."""
    nodes = [n for n in graph.graph_module.graph.nodes if n.target is target]
    assert nodes, f"no {target} in the {graph.kind} graph"
    return [graph.streams.stream(n) for n in nodes]


def _control_syncs(graph: CompiledGraph) -> set[tuple[str | None, str | None]]:
    """(producer stream, consumer stream) of every sync a record/wait pair asked for."""
    syncs = graph.plan.syncs
    return {(s.producer_stream, s.consumer_stream) for s in syncs if s.reason == "control"}


def test_a_stream_block_runs_its_ops_on_a_stream_named_after_its_variable() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        with side:
            z = y.cos() * 2
        return z + y

    x = torch.randn(16, 16)
    compiled, backend = compile_model(f)
    with torch.no_grad():
        assert_same(compiled(x), x.sin().cos() * 2 + x.sin())
    graph = graph_of(backend, "inference")
    assert _on(graph, aten.cos.default) == ["side"]
    assert _on(graph, aten.mul.Tensor) == ["side"]
    assert _on(graph, aten.sin.default) == [None]
    assert _on(graph, aten.add.Tensor) == [None]
    assert graph.streams.side_streams == ("side",)
    data = {(s.producer_stream, s.consumer_stream) for s in graph.plan.syncs}
    assert (None, "side") in data and ("side", None) in data  # y to side, z back to main


def _overlap_model(x: torch.Tensor) -> torch.Tensor:
    main = airstream.current_stream("cpu")
    y = x.sin()
    side.wait_stream(main)
    with side:
        z = y.cos() * 2
        done.record()
    done.wait(main)
    with other:
        u = y.exp()
    main.wait_stream(other)
    return z + u


def test_events_and_wait_stream_become_records_and_waits_between_the_right_streams() -> None:
    x = torch.randn(8, 8)
    compiled, backend = compile_model(_overlap_model)
    with torch.no_grad():
        assert_same(compiled(x), x.sin().cos() * 2 + x.sin().exp())
    graph = graph_of(backend, "inference")
    assert set(graph.streams.side_streams) == {"side", "other"}
    # side.wait_stream(main), done.record() on side + done.wait(main), main.wait_stream(other)
    assert _control_syncs(graph) >= {(None, "side"), ("side", None), ("other", None)}
    gm = graph.graph_module
    assert not [n for n in gm.graph.nodes if torch_internals.torch_stream_op(n.target)]
    assert not [n for n in gm.graph.nodes if n.target in NATIVE_OPS]  # CPU: nothing left over
    records = [graph.streams.stream(n) for n in gm.graph.nodes if n.target is record]
    waits = [graph.streams.stream(n) for n in gm.graph.nodes if n.target is wait]
    assert records == [None, "side", "other"]
    assert waits == ["side", None, None]


def test_training_through_two_native_blocks_gives_eagers_gradients() -> None:
    """torch's own aot_eager and Inductor fail here on CPU builds (AOTAutograd's backward stream
    handling asks for an accelerator); airstream lowers the blocks before AOTAutograd runs."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        with side:
            z = (y @ w).relu()
        with other:
            u = (y * 3).cos()
        return z.sum() + u.sum()

    def plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x.sin()
        return (y @ w).relu().sum() + (y * 3).cos().sum()

    x, w = torch.randn(16, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)
    x2, w2 = (t.detach().clone().requires_grad_() for t in (x, w))
    compiled, backend = compile_model(f)
    got = compiled(x, w)
    got.backward()
    want = plain(x2, w2)
    want.backward()
    assert_same(got, want, rtol=1e-5, atol=1e-5)
    assert_same([x.grad, w.grad], [x2.grad, w2.grad], rtol=1e-5, atol=1e-5)
    forward, backward = graph_of(backend, "forward"), graph_of(backend, "backward")
    assert _on(forward, aten.mm.default) == ["side"]
    assert _on(forward, aten.cos.default) == ["other"]
    # the gradients of each block's ops run on the block's stream: the same object, one stream
    assert set(_on(backward, aten.mm.default)) == {"side"}
    assert _on(backward, aten.threshold_backward.default) == ["side"]
    assert set(backward.streams.side_streams) == set(forward.streams.side_streams)


def test_nested_blocks_innermost_wins() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        with side:
            a = x.sin()
            with other:
                b = a.cos()
            c = b.exp()
        return c

    compiled, backend = compile_model(f)
    x = torch.randn(8)
    with torch.no_grad():
        assert_same(compiled(x), x.sin().cos().exp())
    graph = graph_of(backend, "inference")
    assert _on(graph, aten.sin.default) == ["side"]
    assert _on(graph, aten.cos.default) == ["other"]
    assert _on(graph, aten.exp.default) == ["side"]


def test_a_native_block_and_airstream_stream_nest_either_way() -> None:
    """docs/design.md, stream rule 1: whichever block was entered last is the node's stream."""

    def f(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("air"):
            a = x.sin()
            with side:
                b = a.cos()  # native inside air: side
            c = b.exp()  # air
        with other:
            with airstream.stream("air"):
                d = c.tanh()  # air inside native: air
            e = d.abs()  # other
        return e

    compiled, backend = compile_model(f)
    x = torch.randn(8)
    with torch.no_grad():
        assert_same(compiled(x), x.sin().cos().exp().tanh().abs())
    graph = graph_of(backend, "inference")
    assert _on(graph, aten.sin.default) == ["air"]
    assert _on(graph, aten.cos.default) == ["side"]
    assert _on(graph, aten.exp.default) == ["air"]
    assert _on(graph, aten.tanh.default) == ["air"]
    assert _on(graph, aten.abs.default) == ["other"]


def test_three_blocks_alternating_kinds_keep_their_streams_in_backward() -> None:
    """airstream.stream inside a torch.Stream block inside airstream.stream: each op's gradient
    runs on its own block's stream. A backward graph has no scope markers, only each node's
    annotations; the backend leaves one per node before AOTAutograd (the order of the
    annotation dict, which read the innermost block as the torch.Stream one, is read nowhere)."""

    def f(x: torch.Tensor) -> torch.Tensor:
        with airstream.stream("outer"):
            with side:
                with airstream.stream("inner"):
                    a = torch.relu(x)  # inner
                b = torch.sigmoid(a)  # side
            c = torch.tanh(b)  # outer
        return c

    config = airstream.CompilerConfig()
    config.mode = "reduce-overhead"  # each aten op stays a node of its own to look at
    compiled, backend = compile_model(f, config)
    x = torch.randn(8, requires_grad=True)
    eager = x.detach().clone().requires_grad_(True)
    assert_same(compiled(x), f(eager))
    compiled(x).sum().backward()
    f(eager).sum().backward()
    assert_same(x.grad, eager.grad)
    forward, backward = graph_of(backend, "forward"), graph_of(backend, "backward")
    assert _on(forward, aten.relu.default) == ["inner"]
    assert _on(forward, aten.sigmoid.default) == ["side"]
    assert _on(forward, aten.tanh.default) == ["outer"]
    assert _on(backward, aten.threshold_backward.default) == ["inner"]
    assert _on(backward, aten.sigmoid_backward.default) == ["side"]
    assert _on(backward, aten.tanh_backward.default) == ["outer"]


def test_a_stream_made_inside_the_compiled_function_is_its_own_stream() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        local = torch.Stream(device="cpu")
        with local:
            y = x.sin()
        return y + x

    compiled, backend = compile_model(f)
    x = torch.randn(8)
    with torch.no_grad():
        assert_same(compiled(x), x.sin() + x)
    graph = graph_of(backend, "inference")
    (label,) = graph.streams.side_streams
    assert label.startswith("stream#")  # Dynamo gives no variable for it: a stable index
    assert _on(graph, aten.sin.default) == [label]


class _Layer(torch.nn.Module):
    def __init__(self, alt: torch.Stream) -> None:
        super().__init__()
        self.alt = alt
        self.up = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.alt:
            y = self.up(x).relu()
        return y + x


def test_two_stream_objects_of_one_name_are_two_streams_and_one_object_is_one() -> None:
    shared = torch.Stream(device="cpu")
    model = torch.nn.Sequential(
        _Layer(shared), _Layer(torch.Stream(device="cpu")), _Layer(shared)
    ).eval()
    compiled, backend = compile_model(model)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert_same(compiled(x), model(x))
    graph = graph_of(backend, "inference")
    assert _on(graph, aten.relu.default) == ["alt", "alt_2", "alt"]


def test_synchronize_makes_every_later_stream_wait() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        with side:
            a = x.sin()
        side.synchronize()
        with other:
            b = x.cos()
        return a + b

    compiled, backend = compile_model(f)
    x = torch.randn(8)
    with torch.no_grad():
        assert_same(compiled(x), x.sin() + x.cos())
    graph = graph_of(backend, "inference")
    # the host waits for side: other's later work (and main's) starts after side's sin
    assert ("side", "other") in _control_syncs(graph)
    assert _on(graph, aten.cos.default) == ["other"]


def test_a_wait_for_an_event_recorded_later_warns_with_its_source_line() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        main = airstream.current_stream("cpu")
        done.wait(main)
        with side:
            y = x.sin()
            done.record()
        return y

    compiled, _ = compile_model(f)
    with pytest.warns(UserWarning, match=r"records only later") as caught, torch.no_grad():
        assert_same(compiled(torch.ones(4)), torch.ones(4).sin())
    assert "test_torch_streams.py" in str(caught[0].message)  # the line of done.wait(main)


@pytest.mark.skipif(TORCH < (2, 13), reason="torch 2.11's Dynamo breaks the graph at record_stream")
def test_record_stream_of_a_cpu_tensor_is_kept_by_airstreams_own_lifetimes() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        with side:
            y = x.sin()
        y.record_stream(side)
        return y * 2

    compiled, backend = compile_model(f)
    with torch.no_grad():
        assert_same(compiled(torch.ones(4)), torch.ones(4).sin() * 2)
    gm = graph_of(backend, "inference").graph_module
    assert not [n for n in gm.graph.nodes if n.target in NATIVE_OPS]


def test_the_shared_expert_overlaps_the_routed_experts_on_cpu() -> None:
    """The serving pattern (SGLang's alt_stream, vLLM's shared-experts stream) in plain torch:
    both streams run at once under airstream.profile()."""

    class Moe(torch.nn.Module):
        def __init__(self, alt: torch.Stream | None) -> None:
            super().__init__()
            self.alt_stream = alt
            # ops of several ms: on a machine whose other core is busy, the OS time-slices
            # the two streams' threads, and their ops still overlap in time
            self.shared = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.SiLU())
            self.routed = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.SiLU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.alt_stream is None:
                return self.shared(x) + self.routed(x)
            current = airstream.current_stream("cpu")
            self.alt_stream.wait_stream(current)
            with self.alt_stream:
                shared = self.shared(x)
            routed = self.routed(x)
            current.wait_stream(self.alt_stream)
            return shared + routed

    model = Moe(torch.Stream(device="cpu")).eval()
    plain = Moe(None).eval()
    plain.load_state_dict(model.state_dict())
    compiled, backend = compile_model(model)
    x = torch.randn(512, 1024)
    with torch.no_grad():
        assert_same(compiled(x), plain(x))
        with airstream.profile() as prof:
            for _ in range(3):
                compiled(x)
    graph = graph_of(backend, "inference")
    assert _on(graph, aten.addmm.default) == ["alt_stream", None]
    assert type(graph.executor).__name__ == "CpuExecutor"
    assert set(prof.streams) == {None, "alt_stream"}
    assert prof.overlap() > 1.05, prof.summary()


def test_explain_and_dumps_name_native_streams_by_their_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    config = airstream.CompilerConfig()
    config.debug.graph_dump.type = "txt"
    config.debug.graph_dump.path = str(tmp_path / "dumps")
    compiled, _ = compile_model(_overlap_model, config)
    with torch.no_grad():
        compiled(torch.randn(4, 4))
    dumped = "\n".join(p.read_text() for p in sorted((tmp_path / "dumps").glob("*.txt")))
    assert "side" in dumped and "other" in dumped, dumped
    text = str(airstream.explain(_overlap_model, torch.randn(4, 4)))
    assert "\nside " in text and "stream side:" in text and "stream other:" in text, text
    warned = text.split("== warnings ==")[1]
    assert "left out" not in warned and "cannot" not in warned, warned


def test_a_pass_reads_native_streams_and_may_write_native_form() -> None:
    """The toolkit's streams_of reads a torch.Stream block; a pass may annotate nodes with a
    native stream of its own (a registry index) and airstream runs them there."""
    seen: dict[str, Any] = {}

    def pass_(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        streams = passes.streams_of(gm)
        (cos,) = passes.select_nodes(gm, target=aten.cos.default)
        seen["cos"] = streams.stream(cos)
        (exp,) = passes.select_nodes(gm, target=aten.exp.default)
        index = torch_internals.new_torch_stream(torch.device("cpu"))
        torch_internals.set_dynamo_stream_index(exp, index)
        seen["index"] = index

    def f(x: torch.Tensor) -> torch.Tensor:
        with side:
            y = x.cos()
        return y + x.exp()

    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = pass_
    compiled, backend = compile_model(f, config)
    x = torch.randn(8)
    with torch.no_grad():
        assert_same(compiled(x), x.cos() + x.exp())
    graph = graph_of(backend, "inference")
    assert seen["cos"] == "side"
    assert _on(graph, aten.exp.default) == [f"stream#{seen['index']}"]


def test_a_native_op_given_an_event_for_a_stream_is_a_stream_error_naming_the_node() -> None:
    def pass_(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        (cos,) = passes.select_nodes(gm, target=aten.cos.default)
        event = torch_internals.new_torch_event(torch.device("cpu"))
        with gm.graph.inserting_before(cos):
            gm.graph.call_function(torch_internals.streams_op("wait_stream"), (event, event))

    def f(x: torch.Tensor) -> torch.Tensor:
        with side:
            y = x.cos()
        return y

    config = airstream.CompilerConfig()
    config.post_grad_custom_post_pass = pass_
    compiled, _ = compile_model(f, config)
    with pytest.raises(Exception) as caught, torch.no_grad():
        compiled(torch.ones(2))
    error = caught.value
    while error is not None and not isinstance(error, StreamError):
        error = getattr(error, "inner_exception", None) or error.__cause__
    assert isinstance(error, StreamError), caught.value
    assert "wait_stream needs a stream, got an event" in str(error)
    assert "node 'wait_stream" in str(error)


def test_plain_graphs_never_consult_the_registry() -> None:
    """Graphs without native IR pay nothing: the lowering is not run."""
    compiled, backend = compile_model(lambda x: x.sin() + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            compiled(torch.ones(2))
    graph = graph_of(backend, "inference")
    assert "air_torch_streams" not in graph.graph_module.meta


_LATER_TRAINING = """
import gc, torch, airstream

kept = torch.Stream(device="cpu")  # lives as long as the process

def first():
    alt = torch.Stream(device="cpu")  # gone with this function
    def f(x):
        with alt:
            y = x.sin()
        with kept:
            z = y.cos()
        return z
    torch.compile(f, backend=BACKEND)(torch.randn(4))

first()
torch.compiler.reset()  # as a test suite does between tests
gc.collect()
layer = torch.nn.Linear(4, 4)
torch.compile(layer, backend=BACKEND)(torch.randn(2, 4)).sum().backward()
print("trained", layer.weight.grad is not None)
"""


@pytest.mark.parametrize(
    "backend",
    [
        "airstream.get_backend()",
        pytest.param(
            "'aot_eager'",
            marks=slow(
                "a fresh process; the same import-time fix",
                "tests/test_torch_streams.py::"
                "test_a_later_model_trains_after_the_first_native_stream_frame_is_gone",
            ),
        ),
    ],
)
def test_a_later_model_trains_after_the_first_native_stream_frame_is_gone(backend: str) -> None:
    """torch 2.15's AOTAutograd restores, in every backward, the registry objects of the first
    frame with streams compiled in the process (a stale name): with that frame's first stream
    gone and a later one alive, every later backward failed ("Index past the end of
    index_to_user_object_weakref"), under torch's own backends too. airstream, once imported,
    leaves that first list empty."""
    import subprocess
    import sys

    script = _LATER_TRAINING.replace("BACKEND", backend)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trained True" in done.stdout


def test_a_graph_break_inside_a_stream_block_warns_at_the_block() -> None:
    """torch cannot resume a frame inside a stream block: Dynamo runs the frame eagerly and the
    streams are lost. airstream's CpuStream (airstream.current_stream('cpu'), TorchAir's
    torch.npu.Stream here) says so at the block's line instead of staying silent."""
    from airstream.ops.torch_streams import CpuStream

    block = CpuStream()
    graph_break = torch_internals.dynamo_graph_break()

    def f(x: torch.Tensor) -> torch.Tensor:
        with block:
            y = x.sin()
            graph_break()
            z = y.cos()
        return z + 1

    compiled, backend = compile_model(f)
    with pytest.warns(UserWarning, match="torch.Stream block ran eagerly") as caught:
        assert_same(compiled(torch.ones(3)), f(torch.ones(3)))
    assert caught[0].filename == __file__
    assert backend.graphs == []  # torch ran the frame eagerly


def test_a_current_stream_dynamo_registers_while_compiling_is_main(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dynamo's get_current_stream (AOTAutograd calls it for its own syncs on CUDA) registers
    the caller's stream with a constructor of its own, not a source: still the main stream, not
    a side stream of its own."""
    from airstream.ops.torch_streams import TorchStreams

    stand_in = torch.Stream(device="cpu")  # the caller's "CUDA" stream
    monkeypatch.setattr(torch.accelerator, "current_stream", lambda *a, **k: stand_in)
    index = torch_internals.register_current_stream(torch.device("cuda"))
    table = TorchStreams.from_registry()
    assert table.label(index) is None and table.name(index) == "main"


def test_every_op_of_torchs_stream_ir_has_one_handler() -> None:
    """A handler renamed or an op added to the reader is a failing test, not a silent warning."""
    from airstream.schedule.torch_stream_ops import HANDLERS as _HANDLERS

    assert set(_HANDLERS) == set(torch_internals.STREAM_OPS)
