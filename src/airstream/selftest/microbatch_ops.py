"""The ops :func:`airstream.selftest.microbatch_programs.draw_program` draws: each adds one step
to a program, tracking its value's shape and ground truth (see that module's docstring)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from airstream.selftest.microbatch_programs import (
    ALONG,
    BINARY,
    F64,
    GROUP,
    REDUCE,
    UNARY,
    VIEWS,
    DrawState,
    Skip,
    Value,
    bcast,
    merge,
    moe_lines,
    need,
    size_at,
    slice_text,
    sz_text,
)

__all__ = ["Draw"]


class Draw(DrawState):
    """The ops, one method each: it adds a step, or raises Skip where it does not apply."""

    def unary(self) -> None:
        v = self.pick()
        self.put(self.rng.choice(UNARY).format(v.name), self.new(v, fresh=True))

    def binary(self) -> None:
        v, r = self.pick(), self.rng.random()
        u = self.maybe(lambda u: bcast(v.shape, u.shape)) if r < 0.45 else None
        if u is None and (r < 0.85 or v.kind != "rows"):  # a parameter over the leading dims
            shape = v.shape[self.rng.randrange(len(v.shape)) :] if v.shape else ()
            need(not any(s[0] for s in shape))
            shape = ((0, 1), *shape) if self.coin(0.3) else shape
            u = Value(self.param("b", shape, scale=0.5), shape)
        elif u is None and not self.dynamic:  # a parameter spanning the tokens
            u = Value(self.param("span", v.shape, scale=0.5), v.shape, kind="mixed")
        elif u is None:  # a parameter sliced by the token count: sized by T, a row per position
            need(v.shape[0] == (1, 0) and v.tok() == 0 and not any(s[0] for s in v.shape[1:]))
            big = ((0, max(self.tokens) + 3), *v.shape[1:])
            u = Value(f"{self.param('pos', big, scale=0.5)}[:T]", v.shape, kind="mixed")
        out = bcast(v.shape, u.shape)
        if out is None:
            raise Skip
        expr = self.rng.choice(BINARY).format(*(v.name, u.name)[:: self.rng.choice((1, -1))])
        self.put(expr, self.new(shape=out, fresh=True, **merge([v, u], len(out))))

    def view(self) -> None:
        v = self.pick(lambda v: v.shape)
        nd, t, name, shape, kw = len(v.shape), v.tok(), v.name, list(v.shape), dict[str, Any]()
        how, ones = self.rng.choice(VIEWS), [i for i, s in enumerate(v.shape) if s == (0, 1)]
        need(nd >= 2 or how != "flatten")
        d = self.rng.randrange(nd - 1 if how == "flatten" else nd + (how == "unsqueeze"))
        above = {"dim": t + 1} if t is not None and t >= d else {}  # where a dim is inserted
        if how == "flatten":
            need(not (shape[d][0] and shape[d + 1][0]))
            (a1, b1), (a2, b2) = shape[d : d + 2]
            kw = {"dim": t - 1} if t is not None and t > d else {}
            if (t == d and (a2 or v.map >= 0)) or (t == d + 1 and shape[d] != (0, 1)):
                kw = {"kind": "mixed"}
            elif t == d:
                kw["per"] = v.per * b2
            if v.kind == "shared" and ((a1 and b2 != 1) or (a2 and b1 != 1)):  # varies along T
                kw = {"kind": "mixed"}
            shape[d : d + 2] = [(a1 * b2 + a2 * b1, b1 * b2)]
            sizes = ", ".join(map(sz_text, shape))
            expr = f"{name}.flatten({d}, {d + 1})" if self.coin(0.5) else f"{name}.reshape({sizes})"
        elif how == "unflatten":
            (a, b), per, blocks = shape[d], v.per, v.blocks
            if t == d and v.map == -1 and per > 1:  # a row per token
                shape[d : d + 1], kw["per"], text = [(blocks, 0), (0, per)], 1, f"(-1, {per})"
            elif t == d and v.map == -1 and blocks > 1:  # the copies apart
                shape[d : d + 1], text = [(0, blocks), (per, 0)], f"({blocks}, -1)"
                kw.update(blocks=1, dim=d + 1)
            else:
                need(not a and b % 2 == 0 and t != d)
                shape[d : d + 1], text, kw = [(0, 2), (0, b // 2)], f"(2, {b // 2})", above
            expr = f"{name}.unflatten({d}, {text})"
        elif how == "halve":  # [T, H] -> [2 * T, H // 2]
            need(nd == 2 and v.natural(0) and not shape[1][0] and shape[1][1] % 2 == 0)
            shape = [(2 * shape[0][0], 2 * shape[0][1]), (0, shape[1][1] // 2)]
            expr, kw["per"] = f"{name}.reshape({sz_text(shape[0])}, {shape[1][1]})", 2 * v.per
        elif how == "transpose":
            need(nd >= 2)
            perm = list(range(nd))
            if self.coin(0.3):
                self.rng.shuffle(perm)
                expr = f"{name}.permute({', '.join(map(str, perm))})"
            else:
                d1, d2 = sorted(self.rng.sample(range(nd), 2))
                perm[d1], perm[d2] = d2, d1
                expr = (f"{name}.t()", f"{name}.transpose({d1}, {d2})")[nd > 2 or self.coin(0.5)]
            kw, shape = ({"dim": perm.index(t)} if t is not None else {}), [shape[i] for i in perm]
        elif how == "unsqueeze":
            kw, expr = above, f"{name}.unsqueeze({d})"
            shape.insert(d, (0, 1))
        elif how == "squeeze":
            need(ones)
            gone = ones if self.coin(0.5) else [self.rng.choice(ones)]
            expr = f"{name}.squeeze()" if len(gone) == len(ones) else f"{name}.squeeze({gone[0]})"
            kw = {"dim": t - sum(i < t for i in gone)} if t is not None else {}
            shape = [s for i, s in enumerate(shape) if i not in gone]
        elif how == "expand":
            need(ones)
            d = self.rng.choice(ones)
            shape[d] = (1, 0) if self.coin(0.3) else (0, self.rng.randint(2, 4))
            sizes = ", ".join(sz_text(s) if i == d else "-1" for i, s in enumerate(shape))
            expr = f"{name}.expand({sizes})"
        else:
            kw["fresh"] = self.coin(0.5)
            expr = f"{name}.{'clone' if kw['fresh'] else 'contiguous'}()"
        self.put(expr, self.new(v, shape=tuple(shape), **kw))

    def slice(self) -> None:
        v = self.pick(lambda v: v.shape)
        d = self.rng.randrange(len(v.shape))
        (a, b), t, name, shape, r = v.shape[d], v.tok(), v.name, list(v.shape), self.rng.random()
        kw: dict[str, Any] = {"kind": "mixed"} if t == d else {}
        lo = 0 if a or b < 2 else self.rng.randrange(b - 1)
        n = 2 if a or b < 2 else self.rng.randint(1, b - lo)
        if a and r < 0.3:
            shape[d], expr = (a, b - 1), f"{name}{slice_text(d, '1:')}"
        elif not a and b >= max(self.tokens) and r < 0.3:  # the token count as a size
            shape[d], expr = (1, 0), f"{name}{slice_text(d, ':T')}"
            kw = {"kind": "mixed"} if v.kind == "shared" else kw  # a row per position
        elif (a or b >= 2) and r < 0.8:
            shape[d] = (0, n)
            expr = f"{name}{slice_text(d, f'{lo}:{lo + n}')}"
            expr = f"{name}.narrow({d}, {lo}, {n})" if r < 0.55 else expr
        else:
            del shape[d]
            kw.update({"dim": t - 1} if t is not None and t > d else {})
            expr = f"{name}.select({d}, {lo})"
        self.put(expr, self.new(v, shape=tuple(shape), **kw))

    def cat(self) -> None:
        v = self.pick(lambda v: v.shape)
        nd, d = len(v.shape), self.rng.randrange(len(v.shape))
        u = self.pick(lambda u: len(u.shape) == nd and all(
            u.shape[i] == v.shape[i] for i in range(nd) if i != d))  # fmt: skip
        kw = merge([v, u], nd)
        if d in (v.tok(), u.tok()):  # along the tokens: two copies of them, one after the other
            same = v.kind == u.kind == "rows" and v.map == u.map == -1 and v.shape == u.shape
            same = same and (v.dim, v.per) == (u.dim, u.per)
            kw = {"blocks": v.blocks + u.blocks} if same else {"kind": "mixed"}
        if kw.get("kind") == "shared" and v.shape[d][0]:  # varies along T
            kw = {"kind": "mixed"}
        shape = list(v.shape)
        shape[d] = (v.shape[d][0] + u.shape[d][0], v.shape[d][1] + u.shape[d][1])
        expr = f"torch.cat([{v.name}, {u.name}], dim={d})"
        self.put(expr, self.new(v, shape=tuple(shape), fresh=True, **kw))

    def chunk(self) -> None:
        v = self.pick(lambda v: v.shape)
        d = self.rng.randrange(len(v.shape))
        (a, b), t, shape, kw = v.shape[d], v.tok(), list(v.shape), dict[str, Any]()
        k = self.rng.randrange(2)
        if t == d and v.blocks > 1 and v.map == -1:  # one copy of the tokens back
            shape[d], kw["blocks"], n = (v.per, 0), 1, v.blocks
            expr = self.rng.choice((f"torch.chunk({{0}}, {n}, dim={d})[{k}]",
                                    f"{{0}}.split({{0}}.shape[{d}] // {n}, {d})[{k}]"))  # fmt: skip
        elif t == d:
            shape[d], kw["kind"], expr = (0, 2), "mixed", f"{{0}}.split(2, dim={d})[0]"
        else:
            need(not a and b >= 2)
            first, lo = (b + 1) // 2, self.rng.randint(1, b - 1)
            if self.coin(0.5):
                shape[d], expr = (0, (first, b - first)[k]), f"torch.chunk({{0}}, 2, dim={d})[{k}]"
            else:
                shape[d], expr = (0, lo), f"{{0}}.split([{lo}, {b - lo}], dim={d})[0]"
        self.put(expr.format(v.name), self.new(v, shape=tuple(shape), **kw))

    def reduce(self) -> None:
        v = self.pick(lambda v: v.shape)
        nd, t, keep, form, shape = len(v.shape), v.tok(), self.coin(0.4), "{0}.sum()", []
        d = t if t is not None and self.coin(0.25) else self.rng.randrange(nd)
        kw: dict[str, Any] = {"kind": "mixed" if v.kind != "shared" else "shared"}
        if self.coin(0.95):
            form, shape = self.rng.choice(REDUCE), list(v.shape)
            kw = {"kind": "mixed"} if d == t else {"dim": t - 1} if t and t > d and not keep else {}
            shape[d : d + 1] = [(0, 1)] if keep else []
            if "argmax" in form:
                kw.update(dtype="i", high=0 if v.shape[d][0] else v.shape[d][1])
        expr = form.format(v.name, d - nd if self.coin(0.3) else d, k=", keepdim=True" * keep)
        self.put(expr, self.new(v, shape=tuple(shape), fresh=True, **kw))

    def along(self) -> None:
        """An op along one dim: softmax, normalize, cumsum, sort, topk, argsort."""
        form = self.rng.choice(ALONG)
        v = self.pick(lambda v: v.shape and v.kind != "tokmap", None if "argsort" in form else "f")
        nd, t, shape = len(v.shape), v.tok(), list(v.shape)
        d = t if t is not None and self.coin(0.3) else self.rng.randrange(nd)
        kw: dict[str, Any] = {}
        if d == t or (v.kind == "shared" and v.shape[d][0]):  # a shared value varies along T
            kw = {"kind": "mixed"}
        if "topk" in form:
            need(shape[d] != (0, 1))
            shape[d] = (0, 2)
        if "indices" in form or "argsort" in form:
            kw.update(dtype="i", high=0 if v.shape[d][0] else v.shape[d][1])
            if "argsort" in form and nd == 1 and v.natural(0):  # a permutation of the tokens
                self.maps += 1
                kw = {"dtype": "i", "kind": "tokmap", "map": self.maps, "high": 0}
        expr = form.format(v.name, d - nd if self.coin(0.3) else d)
        self.put(expr, self.new(v, shape=tuple(shape), fresh=True, **kw))

    def norm(self) -> None:
        v = self.pick(lambda v: v.shape and not v.shape[-1][0])
        c = v.shape[-1][1]
        g = self.param("g", ((0, c),), scale=0.1, offset=1.0)
        if self.coin(0.5):
            expr = f"F.layer_norm({v.name}, ({c},), {g}, {self.param('b', ((0, c),), scale=0.1)})"
        else:
            expr = f"{v.name} * torch.rsqrt({v.name}.pow(2).mean(-1, keepdim=True) + 1e-6) * {g}"
        self.put(expr, self.new(v, fresh=True))

    def matmul(self) -> None:
        r, n = self.rng.random(), self.rng.choice((4, 6, 8))
        if r < 0.6:  # tokens on M: x @ W, F.linear, addmm with a bias
            v = self.pick(lambda v: v.shape and not v.shape[-1][0])
            k, shape, kw, form = v.shape[-1], (*v.shape[:-1], (0, n)), {}, self.rng.randrange(3)
            if form == 0 or (form == 2 and len(v.shape) != 2):
                expr = f"{v.name} @ {self.weight(k, n)}"
            elif form == 1:
                w = self.param("w", ((0, n), k), scale=k[1] ** -0.5)
                bias = f", {self.param('b', ((0, n),), scale=0.5)}" if self.coin(0.5) else ""
                expr = f"F.linear({v.name}, {w}{bias})"
            else:
                u = self.maybe(lambda u: u.shape == shape) if self.coin(0.4) else None
                if u is None and not self.dynamic and v.kind == "rows" and self.coin(0.2):
                    u = Value(self.param("span", shape, scale=0.5), shape, kind="mixed")
                u = u or Value(self.param("b", ((0, n),), scale=0.5), ((0, n),))
                kw = merge([v, u], 2)
                expr = f"torch.addmm({u.name}, {v.name}, {self.weight(k, n)})"
            return self.put(expr, self.new(v, shape=shape, fresh=True, **kw))
        if r < 0.8:  # tokens on K: mixes tokens
            v = self.pick(lambda v: len(v.shape) == 2 and v.shape[0][0])
            u = self.pick(lambda u: len(u.shape) == 2 and u.shape[0] == v.shape[0])
            text = self.rng.choice(("{0}.t() @ {1}", "torch.mm({0}.transpose(0, 1), {1})",
                                    "torch.einsum('ti,tj->ij', {0}, {1})"))  # fmt: skip
            kind = "shared" if v.kind == u.kind == "shared" else "mixed"
            val = self.new(shape=(v.shape[1], u.shape[1]), kind=kind, fresh=True)
            return self.put(text.format(v.name, u.name), val)
        v = self.pick(lambda v: len(v.shape) == 3)
        (b, m, k), t = v.shape, v.tok()
        u = self.maybe(lambda u: len(u.shape) == 3 and u.shape[0] == b and u.shape[2] == k)
        if u is not None and self.coin(0.5):  # a batch of [M, K] @ [K, N]
            kw = merge([v, replace(u, dim=(0, 2, 2)[u.dim])], 3)  # u's rows are the result's N
            if 2 in (v.tok(), u.tok()):  # tokens on K
                kw = {"kind": "mixed"}
            expr, shape = f"torch.bmm({v.name}, {u.name}.transpose(1, 2))", (b, m, u.shape[1])
        elif not b[0] and not k[0]:  # tokens on M
            wb = self.param("wb", (b, k, (0, n)), scale=k[1] ** -0.5)
            expr, shape, kw = f"torch.bmm({v.name}, {wb})", (b, m, (0, n)), {}
        else:  # tokens as the batch, moved to M
            need(t == 0 and not m[0] and not k[0])
            wb = self.param("wb", (m, k, (0, n)), scale=k[1] ** -0.5)
            expr, shape = f"torch.bmm({v.name}.transpose(0, 1), {wb})", (m, b, (0, n))
            kw = {"dim": 1}
        self.put(expr, self.new(v, shape=shape, fresh=True, **kw))

    def index(self) -> None:
        """Gathers and scatters by token ids, by data (argmax), and by positions (tokmaps)."""
        idx = self.pick(lambda u: u.kind == "tokmap" or u.high > 0, dtype="i")
        tm, low, one = idx.kind == "tokmap", min(self.tokens), len(idx.shape) == 1
        if tm and idx.per > 1 and self.coin(0.3):  # slots to the tokens they hold
            return self.put(f"{idx.name} // {idx.per}", self.new(idx, per=1, fresh=True))
        if self.coin(0.5) or not one:  # gather

            def fits(s: Value) -> bool:  # the entries index its rows at every token count
                rows = s.shape[0] if s.shape else (0, 0)
                return rows == (idx.per, 0) if tm else size_at(rows, low) >= idx.high

            src = self.maybe(fits) if tm or self.coin(0.5) else None
            if src is None:
                need(not tm)
                table = ((0, idx.high), (0, self.rng.choice((4, 6, 8))))
                src = Value(self.param("table", table), table)
            kw = merge([idx], len(idx.shape)) if src.kind == "shared" else {"kind": "mixed"}
            if tm:  # the tokens reordered: each row is the token the map names
                same = src.natural(0) and src.per == idx.per
                kw = dict(kind="rows", dim=0, map=idx.map) if same else {"kind": "mixed"}
            forms = ["{s}[{i}]", "{s}.index_select(0, {i})", "torch.index_select({s}, 0, {i})"]
            forms = forms if one else forms[:1]
            if len(src.shape) == 2:
                forms.append("F.embedding({i}, {s})")
                if one:
                    forms.append("torch.gather({s}, 0, {i}.unsqueeze(-1).expand(-1, {s}.shape[1]))")
            expr = self.rng.choice(forms).format(s=src.name, i=idx.name)
            return self.put(expr, self.new(shape=idx.shape + src.shape[1:], fresh=True, **kw))
        src = self.pick(lambda s: 0 < len(s.shape) <= 2 and s.shape[0] == idx.shape[0])
        rows = (idx.per, 0) if tm else (1, 0) if idx.high <= low else (0, idx.high)
        shape = (rows, *src.shape[1:])
        tgt = self.maybe(lambda u: u.shape == shape)
        sizes, target = ", ".join(map(sz_text, shape)), Value("", shape)
        text = self.rng.choice((f"torch.zeros({sizes}, {F64})", f"{src.name}.new_zeros({sizes})"))
        if tgt is not None and self.coin(0.7):
            text = f"torch.zeros_like({tgt.name})"
            if self.coin(0.3):
                text, target = f"{tgt.name}.clone()", tgt
        matched = tm and src.natural(0) and src.per == 1 and src.map == idx.map
        into = target.kind == "shared" or (target.natural(0) and target.per == idx.per)
        kw = {"kind": "rows", "per": idx.per} if matched and into else {"kind": "mixed"}
        forms = ["{t}.index_add(0, {i}, {s})", "{t}.index_put(({i},), {s}, accumulate=True)"]
        forms.append("{t}.scatter_add(0, {i}.unsqueeze(-1).expand_as({s}), {s})" if
                     len(src.shape) == 2 else "{t}.scatter_add(0, {i}, {s})")  # fmt: skip
        expr = self.rng.choice(forms).format(t=text, i=idx.name, s=src.name)
        self.put(expr, self.new(shape=shape, fresh=True, **kw))

    def moe(self) -> None:
        """A routed MoE layer (:func:`airstream.selftest.microbatch_programs.moe_lines`)."""
        v = self.pick(lambda v: len(v.shape) == 2 and not v.shape[1][0])
        c, (e, k), out = v.shape[1][1], self.rng.choice(((2, 1), (4, 2), (3, 2))), 4
        router = self.param("router", ((0, c), (0, e)), scale=c**-0.5)
        experts = self.param("experts", ((0, e), (0, c), (0, out)), scale=c**-0.5)
        lines = moe_lines(len(self.steps) + 1, v.name, router, experts, (e, k, out))
        kind = "shared" if v.kind == "shared" else "mixed"
        kind = "rows" if v.natural(0) and v.per == 1 else kind
        self.emit(lines, self.new(v, shape=(v.shape[0], (0, out)), fresh=True, kind=kind))

    def factory(self) -> None:
        """Values made from sizes: zeros, the token count as a value, positions."""
        c, tc = self.rng.choice((1, 4, 8)), ((1, 0), (0, 1))
        v = self.pick(lambda v: v.shape)
        expr, val = self.rng.choice((
            (f"torch.zeros(T, {c}, {F64})", Value("", ((1, 0), (0, c)))),
            (f"x.new_ones(T, {c})", Value("", ((1, 0), (0, c)))),
            (f"torch.full((T, 1), T, {F64})", Value("", tc)),
            (f"torch.full_like({v.name}, T)", Value("", v.shape)),
            (f"{v.name}.new_zeros({', '.join(map(sz_text, v.shape))})", Value("", v.shape)),
            ("torch.arange(T)", Value("", ((1, 0),), dtype="i", kind="tokmap")),
            (f"torch.arange(T, {F64}).unsqueeze(-1)", Value("", tc, kind="mixed")),
        ))  # fmt: skip
        self.put(expr, self.new(val, fresh=True))

    def collective(self) -> None:
        """A collective on ``dist.group.WORLD`` (or the copy of the tokens per rank that an
        ``all_to_all_single`` dispatch sends), in the form inference or training code uses."""
        v, w, tr, grad = self.pick(lambda v: v.shape), self.world, self.training, "_autograd"
        how = self.rng.choice(("all_reduce", "in_place", "gather", "scatter", "a2a", "copies"))
        n, (a, b), lay = f"v{len(self.steps) + 1}", v.shape[0], v.tok() == 0 and v.map == -1
        shape, kw, coll = list(v.shape), dict[str, Any](), how != "copies"
        splits = f"[{v.name}.shape[0] // {w}] * {w}"
        if how == "all_reduce":
            raw = f"funcol.all_reduce({v.name}, 'sum', {GROUP})"
            lines = [f"{n} = {self.rng.choice((f'AllReduce.apply({v.name})', raw)) if tr else raw}"]
            kw = {"kind": "mixed"} if v.map >= 0 and w > 1 else {}
        elif how == "in_place":
            need(tr or (v is self.vals[-1] and v.fresh))
            lines = [f"{n} = AllReduceInPlace.apply({v.name})"] if tr else [
                f"{n} = {v.name}.contiguous()", f"dist.all_reduce({n})"]  # fmt: skip
            kw = {"kind": "mixed"} if v.map >= 0 and w > 1 else {}
        elif how in ("gather", "copies"):
            shape[0] = (a * w, b * w)
            kw = {"blocks": v.blocks * w} if lay else {"kind": "mixed"} if v.tok() == 0 else {}
            lines = [f"{n} = funcol.all_gather_tensor{grad * tr}({v.name}, 0, {GROUP})"]
            if not tr and self.coin(0.4):
                lines = [f"{n} = torch.empty({w} * {v.name}.shape[0], *{v.name}.shape[1:], {F64})",
                         f"dist.all_gather_into_tensor({n}, {v.name}.contiguous())"]  # fmt: skip
            if how == "copies":
                rest = ", ".join(["-1"] * len(shape))
                lines = [f"{n} = {v.name}.unsqueeze(0).expand({w}, {rest}).flatten(0, 1)"]
        else:
            need(a % w == 0 and b % w == 0)
            if how == "scatter":
                shape[0] = (a // w, b // w)
                call = f"reduce_scatter_tensor{grad * tr}({v.name}, 'sum', 0, {GROUP})"
                lines = [f"{n} = funcol.{call}"]
                if not tr and self.coin(0.4):
                    lines = [f"{n} = {v.name}.new_empty({sz_text(shape[0])}, *{v.name}.shape[1:])",
                             f"dist.reduce_scatter_tensor({n}, {v.name}.contiguous())"]  # fmt: skip
            else:
                call = f"all_to_all_single{grad * tr}({v.name}, {splits}, {splits}, {GROUP})"
                lines = [f"{n} = funcol.{call}"]
            if w > 1 and v.tok() == 0:
                kw = {"blocks": 1 if how == "scatter" else w}
                kw = kw if lay and v.blocks == w else {"kind": "mixed"}
        self.emit(lines, self.new(v, shape=tuple(shape), fresh=True, **kw), coll)
        if how == "in_place" and not tr:  # v's memory holds the sum now
            self.dead.add(v.name)
        self.splittable |= coll and v.kind == self.vals[-1].kind == "rows" and v.map == -1
