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

**Parallel projections** (AutoDeploy's attention and GEMM forks): two or more linear layers
(a matrix multiply by a graph input or constant) reading one value. Each linear's branch is what
only it leads to, up to where the paths join: DeepSeek MLA's key/value path (its projection,
split, norm, RoPE and cache write) beside the query path, K or V beside Q, an MLP's up
projection beside its gate. One branch of a group may move to a side stream.

One role is one stream label reused across layers, never a stream per layer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx

from airstream.graph.effects import effects
from airstream.graph.fusion import matmul_rows, multiplies_matrices
from airstream.passes.auto.cost import hinted

__all__ = ["Projections", "SharedExpert", "parallel_projections", "shared_experts"]

aten = torch.ops.aten
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
    source = matmul_rows(node)
    val = hinted(source.meta.get("val")) if source is not None else None
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
            matmuls = [n for n in branch if multiplies_matrices(n)]
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
            if cone & taken or not any(multiplies_matrices(n) for n in cone):
                continue
            return cone
    return None


# --- parallel projections ------------------------------------------------------------------------


class Projections:
    """Linear layers reading one value (Q/K/V; MLA's query and key/value down-projections;
    an MLP's gate and up projections): for each linear, the branch that only it leads to
    (itself and every op after it that no other linear of the group reaches: the RoPE, norm,
    split and cache write of that path), up to the join where the paths meet. Moving one branch
    to a side stream overlaps it with the others."""

    def __init__(self, source: torch.fx.Node, branches: list[list[torch.fx.Node]], tokens: int):
        self.source = source
        self.branches = branches
        self.tokens = tokens


def _strip_views(node: torch.fx.Node) -> torch.fx.Node:
    while node.op == "call_function" and effects(node).view and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return node


def _linear_input(node: torch.fx.Node) -> torch.fx.Node | None:
    """The activation a linear layer reads (views stripped), if ``node`` is one: a matrix
    multiply whose other operand is a weight (a graph input or constant, through views)."""
    if node.target is aten.mm.default:
        activation, weight = node.args[0], node.args[1]
    elif node.target is aten.addmm.default:
        activation, weight = node.args[1], node.args[2]
    else:
        return None
    if not isinstance(activation, torch.fx.Node) or not isinstance(weight, torch.fx.Node):
        return None
    if _strip_views(weight).op not in ("placeholder", "get_attr"):
        return None
    return _strip_views(activation)


def parallel_projections(
    nodes: Iterable[torch.fx.Node], taken: set[torch.fx.Node]
) -> list[Projections]:
    """Every group of two or more linears reading one value, outside ``taken`` (nodes another
    role placed), each with its own branch; in graph order. A branch holds no mutation (those
    stay in place on the main stream) and nothing after one."""
    calls = [n for n in nodes if n.op == "call_function"]
    order = {n: i for i, n in enumerate(calls)}
    groups: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in calls:
        source = _linear_input(node) if node not in taken else None
        if source is not None:
            groups.setdefault(source, []).append(node)
    found: list[Projections] = []
    for source, linears in groups.items():
        if len(linears) < 2:
            continue
        reach = {linear: _reach(linear, forward=True) | {linear} for linear in linears}
        branches = []
        for linear in linears:
            others = set().union(*(reach[o] for o in linears if o is not linear))
            branch = {n for n in reach[linear] - others if n in order and n not in taken}
            blocked = {n for n in branch if effects(n).mutates}
            for n in list(blocked):
                blocked |= _reach(n, forward=True)
            branch -= blocked
            branches.append(sorted(branch, key=order.__getitem__))
        found.append(Projections(source, branches, _rows(linears[0])))
    return sorted(found, key=lambda g: order[g.branches[0][0]] if g.branches[0] else 0)
