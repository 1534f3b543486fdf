"""airstream.graph.effects: what each op does besides computing its result."""

from __future__ import annotations

import torch
import torch.fx

from airstream import torch_internals
from airstream.graph.effect_queries import data_inputs, is_executed, summarize
from airstream.graph.effects import effects
from airstream.graph.fusion import fusible

aten = torch.ops.aten
air = torch.ops.air


def _graph() -> tuple[torch.fx.Graph, torch.fx.Node, torch.fx.Node]:
    graph = torch.fx.Graph()
    return graph, graph.placeholder("x"), graph.placeholder("y")


def test_pure_views_writes_and_randomness() -> None:
    graph, x, y = _graph()
    mm = graph.call_function(aten.mm.default, (x, y))
    view = graph.call_function(aten.view.default, (x, [4]))
    add_ = graph.call_function(aten.add_.Tensor, (x, y))
    copy_ = graph.call_function(aten.copy_.default, (x, mm))
    rand = graph.call_function(aten.rand.default, ([2],))
    split = graph.call_function(aten.split.Tensor, (x, 1))
    assert effects(mm).pure and effects(mm).aliases == ()
    assert effects(view).view and effects(view).aliases == (x,) and effects(view).pure
    assert effects(add_).writes == (x,) and effects(add_).aliases == (x,) and not effects(add_).view
    assert effects(copy_).writes == (x,) and effects(copy_).ordered
    assert effects(rand).random and effects(rand).ordered and not effects(rand).pure
    assert effects(split).aliases == (x,), "a list of views aliases its input (a -> *)"
    assert effects(x).pure and effects(graph.output(mm)).pure


def test_air_ops_collectives_and_what_executors_read() -> None:
    graph, x, y = _graph()
    token = graph.call_function(air.record.default, ())
    waited = graph.call_function(air.wait_tensor.default, (x, y))
    wait = graph.call_function(air.wait.default, ([token],))
    assert effects(waited).air and effects(waited).aliases == (x,)
    assert data_inputs(waited) == [x], "the dependency orders work but is never read"
    assert data_inputs(wait) == [] and not is_executed(wait)
    assert not is_executed(token), "a token only waits read is a position, not work"
    reduce = graph.call_function(torch_internals.collective_op("all_reduce"), (x, "sum", "0"))
    done = graph.call_function(torch_internals.collective_op("wait_tensor"), (reduce,))
    reduce.meta["val"] = torch.empty(2)
    assert effects(reduce).collective and effects(reduce).ordered
    assert effects(done).collective_wait and effects(done).aliases == (reduce,)
    assert not fusible(reduce, set())


def test_fusible_and_a_segments_summary() -> None:
    graph, x, y = _graph()
    for node, val in ((x, torch.empty(2)), (y, torch.empty(2))):
        node.meta["val"] = val
    t = graph.call_function(aten.t.default, (x,))
    add = graph.call_function(aten.add.Tensor, (t, y))
    copy_ = graph.call_function(aten.copy_.default, (x, add))
    rand = graph.call_function(aten.rand.default, ([2],))
    for node in (t, add, copy_, rand):
        node.meta["val"] = torch.empty(2)
    assert fusible(t, set()) and fusible(add, {t}) and fusible(copy_, {t, add})
    assert not fusible(rand, set()), "random ops keep eager's generator order"
    summary = summarize([t, add, copy_], [t, add])
    assert summary.writes == (x,), "the write-back into the graph input is visible outside"
    assert summary.aliases == (x,), "output t is a view of input x"
    assert summarize([add], [add]).aliases == ()


def test_allocations_and_torch_side_effects_decide_merging_and_dropping() -> None:
    from airstream.graph.effect_queries import droppable, mergeable

    graph, x, y = _graph()
    empty = graph.call_function(aten.empty_like.default, (x,))
    relu = graph.call_function(aten.relu.default, (x,))
    check = graph.call_function(aten._assert_async.msg, (x, "x must be nonzero"))
    rand = graph.call_function(aten.rand.default, ([2],))
    add_ = graph.call_function(aten.add_.Tensor, (x, y))
    # fresh memory is pure (droppable when unused) but never merged: two buffers stay two
    assert effects(empty).allocates and effects(empty).pure
    assert droppable(empty) and not mergeable(empty)
    assert mergeable(relu) and droppable(relu)
    # torch's own rule: an assertion is kept though it returns nothing anyone uses
    assert effects(check).impure and not effects(check).pure
    assert not droppable(check) and not mergeable(check)
    assert not droppable(rand) and not droppable(add_)
    assert not droppable(x) and not droppable(graph.output(relu))


def test_an_ops_rule_is_worked_out_once_per_op() -> None:
    from airstream.graph.effects import _rule, written_arguments

    graph, x, y = _graph()
    nodes = [graph.call_function(aten.mul_.Tensor, (x, y)) for _ in range(5)]
    before = _rule.cache_info()
    assert all(effects(n).writes == (x,) for n in nodes)
    after = _rule.cache_info()
    assert after.misses - before.misses <= 1 and after.hits - before.hits >= 4
    assert written_arguments(aten.mul_.Tensor) == ("self",)
    assert written_arguments(aten.mul.Tensor) == ()


def test_higher_order_ops_follow_torchs_impurity_rules() -> None:
    """``auto_functionalized_v2`` is pure when the op it wraps is (its writes are results)."""
    graph, x, y = _graph()
    hop = torch.ops.higher_order.auto_functionalized_v2
    call = graph.call_function(
        hop, (aten.add_.Tensor,), {"other": y, "_self_base_index": 0, "_all_bases": [x]}
    )
    assert effects(call).pure
    assert not torch_internals.torch_side_effects(hop, (aten.add_.Tensor,), {})


def test_a_random_op_whose_arguments_turn_its_draw_off_is_not_random() -> None:
    """Attention with a zero dropout_p and dropout in eval draw nothing: they fuse and reorder
    like any op. A nonzero or unknown probability, or training, keeps them random."""
    graph, x, _ = _graph()
    sdpa = aten._scaled_dot_product_flash_attention_for_cpu.default
    p = graph.placeholder("p")
    default = graph.call_function(sdpa, (x, x, x))  # dropout_p left at its default, 0.0
    zero = graph.call_function(sdpa, (x, x, x), {"dropout_p": 0.0})
    some = graph.call_function(sdpa, (x, x, x, 0.1))
    unknown = graph.call_function(sdpa, (x, x, x, p))
    evaluating = graph.call_function(aten.native_dropout.default, (x, 0.5, False))
    training = graph.call_function(aten.native_dropout.default, (x, 0.5, True))
    bernoulli = graph.call_function(aten.bernoulli.p, (x, 0.0))  # no switch: always draws
    unsaid = graph.call_function(aten.native_dropout.default, (x, 0.5, None))  # None: training
    assert not effects(default).random and not effects(zero).random
    assert effects(some).random and effects(unknown).random
    assert not effects(evaluating).random and effects(training).random
    assert effects(bernoulli).random and effects(unsaid).random
