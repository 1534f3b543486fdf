"""Stream roles found by graph structure: what serving stacks place on side streams by hand.

**Shared expert beside routing** (TensorRT-LLM AutoDeploy's method, on the post-grad aten
graph). A routed MoE block selects experts with ``aten.topk``. Walking forward from the top-k,
the first node that also reads a value computed neither from the top-k (routed) nor before it
(a pass-through such as the residual, an ancestor of the router) is the merge, and that value is
the shared branch's output. The branch is that value's backward cone, stopped at the nodes the
router also depends on (the fork point: the block's normalized input). It is accepted when it
holds a matrix multiply (real work, not a bias) and none of it depends on the routing. Its cheap
consumers inside the cone (Qwen2-MoE's sigmoid gate times the shared output) come along; the
merge itself stays on the main stream. Module names are not read.

One role is one stream label reused across layers (``auto_shared``), never a stream per layer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx

from airstream.passes.auto.cost import hinted

__all__ = ["SharedExpert", "shared_experts"]

aten = torch.ops.aten
_MATMULS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})
_ROUTERS = frozenset({aten.topk.default})


class SharedExpert:
    """One shared-expert branch: its nodes (graph order), the router it runs beside, and the
    token count its first matrix multiply sees (the example value of a symbolic one)."""

    def __init__(self, nodes: list[torch.fx.Node], router: torch.fx.Node, tokens: int) -> None:
        self.nodes = nodes
        self.router = router
        self.tokens = tokens


def _reach(node: torch.fx.Node, forward: bool) -> set[torch.fx.Node]:
    """Every node ``node`` reaches through its users (``forward``) or through its inputs."""
    seen: set[torch.fx.Node] = set()
    stack = list(node.users if forward else node.all_input_nodes)
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.users if forward else n.all_input_nodes)
    return seen


def _cone(output: torch.fx.Node, stop: set[torch.fx.Node]) -> set[torch.fx.Node]:
    """``output`` and its call ancestors, not crossing ``stop``."""
    cone: set[torch.fx.Node] = set()
    stack = [output]
    while stack:
        n = stack.pop()
        if n in cone or n in stop or n.op != "call_function":
            continue
        cone.add(n)
        stack.extend(n.all_input_nodes)
    return cone


def _rows(node: torch.fx.Node) -> int:
    """Rows of a matrix multiply's input (tokens), from its example value."""
    source = node.args[1] if node.target in (aten.addmm.default, aten.baddbmm.default) else None
    source = source if source is not None else node.args[0]
    val = hinted(source.meta.get("val")) if isinstance(source, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and val.dim() >= 1:
        return int(val.numel() // max(int(val.shape[-1]), 1))
    return 0


def shared_experts(nodes: Iterable[torch.fx.Node]) -> list[SharedExpert]:
    """Every shared-expert branch in the graph (see the module docstring), in graph order."""
    calls = [n for n in nodes if n.op == "call_function"]
    order = {n: i for i, n in enumerate(calls)}
    taken: set[torch.fx.Node] = set()
    found: list[SharedExpert] = []
    for router in (n for n in calls if n.target in _ROUTERS):
        branch = _branch_beside(router, order, taken)
        if branch is not None:
            matmuls = [n for n in branch if n.target in _MATMULS]
            first = min(matmuls, key=order.__getitem__)
            found.append(SharedExpert(sorted(branch, key=order.__getitem__), router, _rows(first)))
            taken |= branch
    return found


def _branch_beside(
    router: torch.fx.Node, order: dict[torch.fx.Node, int], taken: set[torch.fx.Node]
) -> set[torch.fx.Node] | None:
    """The shared branch merged into ``router``'s routed output, if there is one."""
    routed = _reach(router, forward=True)
    before = _reach(router, forward=False)
    for merge in sorted((n for n in routed if n in order), key=order.__getitem__):
        for value in merge.all_input_nodes:
            if value.op != "call_function" or value in routed or value in before:
                continue
            cone = _cone(value, before)
            # a weight's transpose or a constant is no branch; a branch already taken (a second
            # router of the same block) is not found twice
            if cone & taken or not any(n.target in _MATMULS for n in cone):
                continue
            return cone
    return None
