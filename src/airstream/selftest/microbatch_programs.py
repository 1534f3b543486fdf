"""Random programs for the ``microbatch_overlap`` fuzzer: torch ops on a token input ``x``
(``[T, H]`` or ``[T, A, H]``, float64; sometimes a second token input ``y`` and token ids
``ids``), with collectives between them, as an ``nn.Module``'s ``forward``.

A program is plain data (:class:`MicrobatchProgram`); each step is the Python source defining
one value, so ``str(program)`` is the ``forward`` as it runs. The drawer tracks each value's
shape (sizes ``a * T + b``), dtype and a ground truth of its own, written apart from the pass:
``rows`` (each row depends only on its own token's rows of every input: at token dim ``dim``,
``per`` rows per token, ``blocks`` copies of all tokens one after another, or reordered by token
map ``map``), ``shared`` (no token's data), ``tokmap`` (int positions of tokens: ``arange(T)``,
an ``argsort`` over the tokens) or ``mixed``.
"""

from __future__ import annotations

import hashlib
import linecache
import math
import random
import re
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from airstream.torch_internals import functional_collectives

__all__ = ["MicrobatchProgram", "Step", "TensorSpec", "build_module", "make_inputs",
           "size_at", "sz_text"]  # fmt: skip

Sz = tuple[int, int]  # a size: a * T + b


@dataclass(frozen=True)
class TensorSpec:
    """An input or parameter: float64 ``offset + scale * randn``, or int64 in ``[0, high)``."""

    name: str
    shape: tuple[Sz, ...]
    dtype: str = "float64"
    high: int = 0
    scale: float = 1.0
    offset: float = 0.0


@dataclass(frozen=True)
class Step:
    """Source lines defining ``defines`` from ``uses``; ``note``: its shape and ground truth."""

    lines: tuple[str, ...]
    defines: str
    uses: tuple[str, ...]
    note: str
    collective: bool = False


@dataclass(frozen=True)
class MicrobatchProgram:
    """A module's ``forward(self, x, ...)``; ``tokens``: the token counts it is called with (one
    for a static graph); ``splittable``: by the ground truth, some collective takes rows and
    gives rows (it could run per micro-batch)."""

    inputs: tuple[TensorSpec, ...]
    params: tuple[TensorSpec, ...]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]
    tokens: tuple[int, ...]
    dynamic: bool
    training: bool
    world: int = 1
    splittable: bool = False

    def source(self) -> str:
        """The ``forward`` function's source."""
        names = ", ".join(s.name for s in self.inputs)
        lines = [f"def forward(self, {names}):", "    T = x.shape[0]"]
        for step in self.steps:
            lines += [f"    {line}" for line in step.lines[:-1]]
            lines.append(f"    {step.lines[-1]}  # {step.note}")
        return "\n".join([*lines, f"    return ({', '.join(self.outputs)},)"]) + "\n"

    def __str__(self) -> str:
        head = [
            f"# {'dynamic' if self.dynamic else 'static'}, "
            f"{'training' if self.training else 'inference'}, tokens "
            f"{', '.join(map(str, self.tokens))}, world {self.world}"
            + (", splittable" if self.splittable else "")
        ]
        for kind, specs in (("input", self.inputs), ("param", self.params)):
            for s in specs:
                ints = f" in [0, {s.high})" if s.dtype == "int64" else ""
                shape = ", ".join(map(sz_text, s.shape))
                head.append(f"# {kind} {s.name}: [{shape}] {s.dtype}{ints}")
        return "\n".join(head) + "\n" + self.source()


def sz_text(s: Sz) -> str:
    """A size as Python source (``2 * T - 1``)."""
    a, b = s
    t = "T" if a == 1 else f"{a} * T"
    return str(b) if not a else t if not b else f"{t} {'+' if b > 0 else '-'} {abs(b)}"


def size_at(s: Sz, tokens: int) -> int:
    """A size at ``tokens`` tokens."""
    return s[0] * tokens + s[1]


@dataclass(frozen=True)
class Value:
    """A value while drawing (see the module docstring); ``high``: int entries are below it (0:
    unknown); ``fresh``: new memory (not an input, parameter or view)."""

    name: str
    shape: tuple[Sz, ...]
    dtype: str = "f"
    kind: str = "shared"
    dim: int = 0
    per: int = 1
    blocks: int = 1
    map: int = -1
    high: int = 0
    fresh: bool = False

    def tok(self) -> int | None:
        return self.dim if self.kind == "rows" else None

    def natural(self, dim: int = 0) -> bool:
        """Rows at ``dim``, in token order, one copy."""
        return self.kind == "rows" and self.dim == dim and self.blocks == 1 and self.map == -1

    def note(self) -> str:
        shape = f"[{', '.join(map(sz_text, self.shape))}]" + ("" if self.dtype == "f" else " int")
        if self.kind == "tokmap":
            return f"{shape} tokmap " + (f"m{self.map}/{self.per}" if self.map >= 0 else "arange")
        if self.kind != "rows":
            return f"{shape} {self.kind}"
        how = [f"@{self.dim}" * (self.dim > 0), f" per {self.per}" * (self.per > 1)]
        how += [f" x{self.blocks}" * (self.blocks > 1), f" by m{self.map}" * (self.map >= 0)]
        return f"{shape} rows{''.join(how)}"


def bcast(a: tuple[Sz, ...], b: tuple[Sz, ...]) -> tuple[Sz, ...] | None:
    out: list[Sz] = []
    for i in range(1, max(len(a), len(b)) + 1):
        x, y = (a[-i] if i <= len(a) else (0, 1)), (b[-i] if i <= len(b) else (0, 1))
        if x != y and (0, 1) not in (x, y):
            return None
        out.append(y if x == (0, 1) else x)
    return tuple(reversed(out))


def merge(vals: list[Value], nd: int) -> dict[str, Any]:
    """The ground truth of a pointwise op's result (``nd`` dims) from its operands'."""
    if any(v.kind in ("mixed", "tokmap") for v in vals):
        return {"kind": "mixed"}
    lays = {(v.dim + nd - len(v.shape), v.per, v.blocks, v.map) for v in vals if v.kind == "rows"}
    if len(lays) != 1:
        return {"kind": "shared" if not lays else "mixed"}
    return dict(zip(("kind", "dim", "per", "blocks", "map"), ("rows", *lays.pop()), strict=True))


def slice_text(d: int, text: str) -> str:
    return f"[{':, ' * d}{text}]"


UNARY = ("torch.relu({0})", "torch.tanh({0})", "torch.sigmoid({0})", "torch.sin({0})",
         "F.gelu({0})", "F.silu({0})", "{0}.abs()", "-{0}", "torch.log1p({0}.abs())", "{0} * 0.5",
         "{0} ** 2", "{0}.clamp(-0.5, 0.5)", "{0}.clamp(min=0.0)", "({0} > 0).to(torch.float64)",
         "{0}.to(torch.float32).to(torch.float64)", "torch.where({0} > 0, {0}, 0.1 * {0})",
         "{0} / T", "{0} * T", "{0} / torch.full_like({0}, T)", "{0} - T / 2")  # fmt: skip
BINARY = ("{0} + {1}", "{0} - {1}", "{0} * {1}", "torch.maximum({0}, {1})",
          "{0} / ({1}.abs() + 1.0)", "torch.where({0} > {1}, {0}, {1})")  # fmt: skip
REDUCE = ("{0}.sum({1}{k})", "{0}.mean({1}{k})", "{0}.amax({1}{k})", "{0}.amin({1}{k})",
          "torch.logsumexp({0}, {1}{k})", "{0}.var({1}{k}, correction=0)",
          "torch.norm({0}, dim={1}{k})", "torch.linalg.vector_norm({0}, dim={1}{k})",
          "{0}.max({1}{k}).values", "{0}.argmax({1}{k})")  # fmt: skip
ALONG = ("torch.softmax({0}, dim={1})", "F.log_softmax({0}, dim={1})", "F.normalize({0}, dim={1})",
         "torch.cumsum({0}, dim={1})", "torch.sort({0}, dim={1}).values",
         "torch.topk({0}, 2, dim={1}).values", "torch.topk({0}, 2, dim={1}).indices",
         "torch.argsort({0}, dim={1})")  # fmt: skip
F64 = "dtype=torch.float64"
GROUP = "dist.group.WORLD"
OP_WEIGHTS = {"unary": 10, "binary": 14, "view": 14, "slice": 5, "cat": 3, "chunk": 3, "reduce": 7,
              "along": 8, "norm": 4, "matmul": 12, "index": 9, "moe": 2, "factory": 4,
              "collective": 14}  # fmt: skip
VIEWS = ("flatten", "unflatten", "transpose", "unsqueeze", "squeeze", "expand", "copy", "halve")


def moe_lines(n: int, x: str, router: str, experts: str, sizes: tuple[int, int, int]) -> list[str]:
    """A routed MoE layer as models write it, defining ``v{n}`` from ``x`` (``sizes``: experts,
    experts per token, output width): top-k experts per token, the tokens sorted by expert, a
    masked matmul per expert, weighted by the gate and added back at each token."""
    e, k, out = sizes
    masked = f"(ex{n} == {{i}}).unsqueeze(-1) * (xs{n} @ {experts}[{{i}}])"
    return [
        f"probs{n} = torch.softmax({x} @ {router}, dim=-1)",
        f"gate{n}, eid{n} = torch.topk(probs{n}, {k}, dim=-1)",
        f"flat{n} = eid{n}.reshape(-1)",
        f"order{n} = torch.argsort(flat{n}, stable=True)",
        f"tok{n} = order{n} // {k}",
        f"xs{n}, ex{n} = {x}[tok{n}], flat{n}[order{n}]",
        f"ys{n} = torch.zeros(xs{n}.shape[0], {out}, {F64})",
        *(f"ys{n} = ys{n} + " + masked.format(i=i) for i in range(e)),
        f"ys{n} = ys{n} * gate{n}.reshape(-1)[order{n}].unsqueeze(-1)",
        f"v{n} = torch.zeros({x}.shape[0], {out}, {F64}).index_add(0, tok{n}, ys{n})",
    ]


class Skip(Exception):
    """The op drawn does not apply to the values at hand."""


def need(cond: Any) -> None:
    """Raises Skip unless ``cond`` holds."""
    if not cond:
        raise Skip


class DrawState:
    """A program being drawn: its steps, parameters and live values (the ops:
    :mod:`airstream.selftest.microbatch_ops`)."""

    def __init__(self, rng: random.Random, world: int, prog: dict[str, Any]) -> None:
        self.rng, self.world, self.maps, self.splittable = rng, world, 0, False
        self.tokens, self.dynamic, self.training = prog["tokens"], prog["dynamic"], prog["training"]
        self.steps: list[Step] = []
        self.params: list[TensorSpec] = []
        self.vals: list[Value] = []
        self.dead: set[str] = set()

    def coin(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, pred: Any = None, dtype: str | None = "f") -> Value:
        """A live value (the newest, 40% of the time) where ``pred`` holds; else Skip."""
        live = [v for v in self.vals if v.name not in self.dead and dtype in (None, v.dtype)]
        live = [v for v in live if pred is None or pred(v)]
        need(live)
        return live[-1] if self.coin(0.4) else self.rng.choice(live)

    def maybe(self, pred: Any = None, dtype: str | None = "f") -> Value | None:
        try:
            return self.pick(pred, dtype)
        except Skip:
            return None

    def param(self, prefix: str, shape: tuple[Sz, ...], **kw: Any) -> str:
        self.params.append(TensorSpec(f"self.{prefix}{len(self.params)}", shape, **kw))
        return self.params[-1].name

    def weight(self, k: Sz, n: int) -> str:
        """A ``[k, n]`` weight: the input ``w_in`` where it fits (half the time) or a parameter."""
        if any(v.name == "w_in" and v.shape == (k, (0, n)) for v in self.vals) and self.coin(0.5):
            return "w_in"
        return self.param("w", (k, (0, n)), scale=max(k[1], 1) ** -0.5)

    def new(self, like: Value | None = None, **kw: Any) -> Value:
        kw = {"name": f"v{len(self.steps) + 1}", "fresh": False, **kw}
        return replace(like or Value("", ()), **kw)

    def emit(self, lines: list[str], val: Value, coll: bool = False) -> None:
        """Adds a step where the value's sizes are at least 1 (2 where they follow T) at every
        token count, and it is not too big."""
        for t in self.tokens:
            sizes = [size_at(s, t) for s in val.shape]
            need(all(n >= 1 + bool(s[0]) for n, s in zip(sizes, val.shape, strict=True)))
            need(math.prod(sizes) <= 4096)
        used = re.findall(r"\b(v\d+|x|y|ids|w_in)\b", "\n".join(lines))
        uses = tuple(dict.fromkeys(n for n in used if n != val.name))
        self.steps.append(Step(tuple(lines), val.name, uses, val.note(), coll))
        self.vals.append(val)

    def put(self, expr: str, val: Value) -> None:
        self.emit([f"{val.name} = {expr}"], val)


funcol = functional_collectives()


class AllReduce(torch.autograd.Function):
    """Megatron's reduce from the model-parallel region: a sum forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, v: torch.Tensor) -> torch.Tensor:
        return funcol.all_reduce(v, "sum", dist.group.WORLD)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class AllReduceInPlace(AllReduce):
    """The same with ``dist.all_reduce`` in place, as Megatron writes it."""

    @staticmethod
    def forward(ctx: Any, v: torch.Tensor) -> torch.Tensor:
        v = v.clone()
        dist.all_reduce(v)
        return v


def build_module(program: MicrobatchProgram, seed: int = 0) -> torch.nn.Module:
    """The program as an ``nn.Module`` (its parameters drawn from ``seed``; one spanning the
    tokens sized for the program's first token count)."""
    src = program.source()
    filename = f"<microbatch-program-{hashlib.sha1(src.encode()).hexdigest()[:10]}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    namespace: dict[str, Any] = {"torch": torch, "F": F, "dist": dist, "funcol": funcol}
    namespace.update(AllReduce=AllReduce, AllReduceInPlace=AllReduceInPlace)
    exec(compile(src, filename, "exec"), namespace)
    cls = type("MicrobatchProgramModule", (torch.nn.Module,), {"forward": namespace["forward"]})
    module = cls()
    gen = torch.Generator().manual_seed(seed)
    for spec in program.params:
        data = _tensor(spec, program.tokens[0], gen)
        module.register_parameter(spec.name.removeprefix("self."), torch.nn.Parameter(data))
    return module


def _tensor(spec: TensorSpec, tokens: int, gen: torch.Generator) -> torch.Tensor:
    shape = [size_at(s, tokens) for s in spec.shape]
    if spec.dtype == "int64":
        return torch.randint(0, spec.high, shape, generator=gen)
    return spec.offset + spec.scale * torch.randn(shape, generator=gen, dtype=torch.float64)


def make_inputs(program: MicrobatchProgram, tokens: int, seed: int) -> list[torch.Tensor]:
    """The program's inputs at ``tokens`` tokens, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return [_tensor(spec, tokens, gen) for spec in program.inputs]
