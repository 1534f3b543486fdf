"""A side stream runs under the caller's thread state, and a compiled graph can be called from
inside another graph's streams.

Each state test compiles ``look(sin(x)) + look(cos(x))`` with the second ``look`` (and the
``cos``) on stream ``side``; ``look`` records the thread-local torch state it runs under, so the
test compares what the side stream saw with what the main stream saw, on the caller's OpenMP
team and on a worker thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import torch
from tests.conftest import compile_model, graph_of
from torch.profiler import profile
from torch.utils.flop_counter import FlopCounterMode

import airstream
from airstream import passes, torch_internals

# the thread-state extension builds against each torch's headers
pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

SEEN: list[tuple[str, str, dict[str, Any]]] = []


@torch.library.custom_op("airstream_test::look", mutates_args=())
def look(x: torch.Tensor, tag: str) -> torch.Tensor:
    """A copy of ``x``; notes the tag, the thread and the torch state it ran under."""
    SEEN.append(
        (
            tag,
            threading.current_thread().name,
            {
                "grad": torch.is_grad_enabled(),
                "inference": torch.is_inference_mode_enabled(),
                "autocast": torch.is_autocast_enabled("cpu"),
                "hooks": torch_internals.saved_tensor_hooks_set(),
            },
        )
    )
    return x.clone()


@look.register_fake
def _(x: torch.Tensor, tag: str) -> torch.Tensor:
    return torch.empty_like(x)


look.register_autograd(lambda ctx, grad: (grad, None))


def _model(x: torch.Tensor) -> torch.Tensor:
    a = torch.ops.airstream_test.look(x.sin(), "main")
    b = torch.ops.airstream_test.look(x.cos(), "side")
    return a + b


def _side_pass(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    chosen = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and (n.args[1:2] == ("side",) or n.target is torch.ops.aten.cos.default)
    ]
    passes.place_on_stream(gm, chosen, "side")


def _compiled(team: bool) -> tuple[Callable[..., Any], Any]:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _side_pass
    config.stream_config.openmp_team = team
    return compile_model(_model, config)


def _states() -> dict[str, dict[str, Any]]:
    return {tag: state for tag, _, state in SEEN}


STATES: dict[str, Callable[[], AbstractContextManager[Any]]] = {
    "inference_mode": torch.inference_mode,
    "no_grad": torch.no_grad,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    "saved_tensor_hooks": lambda: torch.autograd.graph.saved_tensors_hooks(
        lambda t: t, lambda t: t
    ),
}


@pytest.fixture(params=[True, False], ids=["openmp-team", "worker-thread"])
def team(request: pytest.FixtureRequest) -> Iterator[bool]:
    yield request.param


@pytest.mark.parametrize("name", list(STATES))
def test_a_side_stream_runs_under_the_callers_state(name: str, team: bool) -> None:
    compiled, backend = _compiled(team)
    # hooks pack what a training graph saves: its forward is what they are active around
    x = torch.randn(8, requires_grad=name == "saved_tensor_hooks")
    with STATES[name]():
        compiled(x)  # compiles under the state, as a user's first call would
        SEEN.clear()
        out = compiled(x)
        want = x.sin() + x.cos()
    (graph,) = backend.graphs  # inference, or the forward (the backward compiles when run)
    assert graph.streams.nodes_on("side"), "the pass put work on the side stream"
    threads = {tag: thread for tag, thread, _ in SEEN}
    assert threads["side"] != threads["main"], "the side stream ran on another thread"
    seen = _states()
    assert seen["side"] == seen["main"], f"side saw {seen['side']}, main {seen['main']}"
    torch.testing.assert_close(out, want)
    if name == "inference_mode":
        assert seen["side"]["inference"]
        assert out.is_inference()
    if name == "saved_tensor_hooks":
        assert seen["side"]["hooks"]


def test_the_side_streams_thread_keeps_its_own_state_after_the_call(team: bool) -> None:
    compiled, _ = _compiled(team)
    x = torch.randn(8)
    with torch.inference_mode():
        compiled(x)
        compiled(x)
    SEEN.clear()
    compiled(x)  # outside inference mode now
    seen = _states()
    assert not seen["side"]["inference"] and seen["side"] == seen["main"]


def test_torch_profiler_records_the_side_streams_ops(team: bool) -> None:
    compiled, _ = _compiled(team)
    x = torch.randn(8)
    compiled(x)
    SEEN.clear()
    with profile() as prof:  # no profile_all_threads: the caller's thread state carries it
        compiled(x)
    events = prof.events()
    looks = [e for e in events if e.name == "airstream_test::look"]
    assert len(looks) == 2, [e.name for e in events]
    assert len({e.thread for e in looks}) == 2, "each on the thread of its stream"
    assert sum(e.name == "aten::cos" for e in events) == 1, "the side stream's own aten op"


def test_a_dispatch_mode_sees_every_op_as_in_eager() -> None:
    """Dynamo runs a function eagerly while a dispatch mode is active (torch's rule): the mode
    (here torch's flop counter) counts every op of the model, as in eager."""
    w = torch.randn(16, 16)

    def model(x: torch.Tensor) -> torch.Tensor:
        return (x @ w).sin() + (x @ w.t()).cos()

    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = _on_side(lambda n: n.target is torch.ops.aten.cos.default)
    compiled, _ = compile_model(model, config)
    x = torch.randn(4, 16)
    compiled(x)
    with FlopCounterMode(display=False) as counted:
        out = compiled(x)
    with FlopCounterMode(display=False) as eager:
        want = model(x)
    torch.testing.assert_close(out, want)
    assert counted.get_total_flops() == eager.get_total_flops() == 2 * 2 * 4 * 16 * 16


# ---- a compiled graph called from inside another graph's streams -----------------------------

INNER: dict[str, Callable[..., Any]] = {}


@torch.library.custom_op("airstream_test::call_inner", mutates_args=())
def call_inner(x: torch.Tensor) -> torch.Tensor:
    """Calls the compiled function in ``INNER["fn"]`` (a Python op calling compiled code)."""
    return INNER["fn"](x).clone()


@call_inner.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _inner(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2 + x.cos()


def _outer(x: torch.Tensor) -> torch.Tensor:
    a = x.exp()
    b = torch.ops.airstream_test.call_inner(x.neg())
    return a + b


def _on_side(select: Callable[[torch.fx.Node], bool]) -> Callable[..., None]:
    def place(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
        passes.place_on_stream(
            gm, [n for n in gm.graph.nodes if n.op == "call_function" and select(n)], "side"
        )

    return place


def _call_with_timeout(fn: Callable[[], Any], seconds: float = 120.0) -> Any:
    """``fn()`` on a thread; fails, not hangs, when it does not return in time."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as error:  # handed to the test
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"no return within {seconds} s: a deadlock"
    if errors:
        raise errors[0]
    return result[0]


@pytest.mark.parametrize("where", ["side", "main"])
def test_a_graph_called_from_inside_another_graphs_stream_returns(where: str, team: bool) -> None:
    """The op calling the inner graph runs on the outer graph's ``side`` stream, or on its main
    stream while ``side`` waits for it; the inner graph has a ``side`` stream of its own (the same
    worker): it runs on the calling thread instead of queueing behind the outer call."""

    def inner_side(n: torch.fx.Node) -> bool:
        return n.target is torch.ops.aten.cos.default

    def outer_side(n: torch.fx.Node) -> bool:
        calls = n.target is torch.ops.airstream_test.call_inner.default
        return calls if where == "side" else n.target is torch.ops.aten.add.Tensor

    inner_config = airstream.CompilerConfig()
    inner_config.post_grad_custom_pre_pass = _on_side(inner_side)
    inner_config.stream_config.openmp_team = team
    inner, inner_backend = compile_model(_inner, inner_config)
    outer_config = airstream.CompilerConfig()
    outer_config.post_grad_custom_pre_pass = _on_side(outer_side)
    outer_config.stream_config.openmp_team = team
    outer, outer_backend = compile_model(_outer, outer_config)
    x = torch.randn(8)
    INNER["fn"] = inner
    try:
        for _ in range(3):
            out = _call_with_timeout(lambda: outer(x))
            torch.testing.assert_close(out, x.exp() + _inner(x.neg()))
    finally:
        INNER.clear()
    assert graph_of(inner_backend, "inference").streams.nodes_on("side")
    assert graph_of(outer_backend, "inference").streams.nodes_on("side")


def test_threads_calling_one_graph_and_different_graphs_at_once_get_exact_results() -> None:
    configs = []
    for select in (
        lambda n: n.target is torch.ops.aten.cos.default,
        lambda n: n.target is torch.ops.aten.mul.Tensor,
    ):
        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = _on_side(select)
        configs.append(config)
    graphs = [compile_model(_inner, config)[0] for config in configs]
    inputs = [torch.randn(64) for _ in range(8)]
    for graph in graphs:  # compiled from one thread first (docs/torch-versions.md)
        graph(inputs[0])
    failures: list[str] = []

    def caller(i: int) -> None:
        graph, x = graphs[i % 2], inputs[i]
        want = _inner(x)
        for call in range(200):
            if not torch.equal(graph(x), want):
                failures.append(f"thread {i}, call {call}")
                return

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a caller did not return: a deadlock"
    assert not failures, failures
