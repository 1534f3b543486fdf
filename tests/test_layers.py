"""The module layers of docs/design.md: no import runs from a lower layer to a higher one, and no
module but ``airstream.effects`` reads an op's schema or tags to decide its effects."""

from __future__ import annotations

import ast
import pathlib

import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "airstream"

# Lowest first. A module may import its own layer and any layer below it.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "base",
        frozenset(
            {
                "errors",
                "tracebacks",
                "environment",
                "cache_dir",
                "calibration",
                "openmp",
                "launch",
                "torch_internals",
                "option_checks",
                "options",
                "config",
                "mode",
                "ops",
                "foreign_ops",
                "effects",
                "fusion",
                "fused",
                "layouts",
                "nodes",
                "devices",
                "streams",
                "placements",
                "decompositions",
            }
        ),
    ),
    # the planner: what a placement costs in syncs is its answer, which the automatic passes ask
    ("planner", frozenset({"schedule.deps", "schedule.plan", "schedule.overlap"})),
    ("passes", frozenset({"passes"})),
    ("schedule", frozenset({"schedule"})),
    ("runtime", frozenset({"runtime"})),
    ("observers", frozenset({"observers", "debug"})),
    (
        "backend",
        frozenset(
            {
                "backend",
                "pipeline",
                "measuring",
                "finish",
                "graph_cache",
                "cached_graph",
                "cache_key",
                "decisions",
            }
        ),
    ),
    (
        "applications",
        frozenset(
            {
                "__init__",
                "explain",
                "inductor",
                "demo",
                "cli",
                "run_report",
                "doctor",
                "bench",
                "selftest",
                "compat",
                "compile_cache",
                "cache_files",
                "examples",
                "__main__",
            }
        ),
    ),
)


def _layer(part: str) -> int:
    """The layer of ``part``, a dotted path below ``airstream`` (``schedule.plan``): the entry
    naming the longest prefix of it (``schedule.plan`` before ``schedule``)."""
    pieces = part.split(".")
    for length in range(len(pieces), 0, -1):
        prefix = ".".join(pieces[:length])
        for index, (_, parts) in enumerate(LAYERS):
            if prefix in parts:
                return index
    raise AssertionError(f"airstream.{part} is in no layer of tests/test_layers.py: add it")


def _top(module: str) -> str:
    """``airstream.schedule.plan`` -> ``schedule.plan``; the package root -> ``__init__``."""
    parts = module.split(".")
    return ".".join(parts[1:]) if len(parts) > 1 else "__init__"


def _part(path: pathlib.Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def _dynamic_import(node: ast.AST) -> str | None:
    """The module ``importlib.import_module("airstream...")`` imports, if ``node`` is such a
    call with a literal name (an import all the same, only later)."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if name in ("import_module", "__import__") and isinstance(first, ast.Constant):
        value = first.value
        if isinstance(value, str) and value.startswith("airstream"):
            return value
    return None


def _imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every airstream import, those under ``if TYPE_CHECKING:`` included: a
    type-only import upward is still a circle in the design (the type belongs below its users)."""
    found = []
    for node in ast.walk(tree):
        dynamic = _dynamic_import(node)
        if dynamic is not None:
            found.append((node.lineno, dynamic))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("airstream")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("airstream"):
            module = node.module or ""
            if module == "airstream":  # from airstream import torch_internals, ...
                found += [(node.lineno, f"airstream.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, module))
    return found


def _modules() -> list[pathlib.Path]:
    return sorted(p for p in SRC.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    for path in _modules():
        _layer(_part(path))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_runs_upward(path: pathlib.Path) -> None:
    own = _layer(_part(path))
    tree = ast.parse(path.read_text())
    upward = []
    for line, module in _imports(tree):
        target = _top(module)
        if target in ("__init__",):
            continue  # `import airstream.x` style of the package root resolves per name
        if _layer(target) > own:
            upward.append(
                f"{path.relative_to(SRC)}:{line} imports {module} "
                f"({LAYERS[_layer(target)][0]} is above {LAYERS[own][0]})"
            )
    assert not upward, "\n".join(upward)


def test_only_the_effects_module_reads_effects_from_schemas() -> None:
    """Mutation, aliasing and randomness are decided in airstream.effects alone."""
    markers = (
        "nondeterministic_seeded",
        ".is_mutable",
        "alias_info",
        "is_impure(",
        "_side_effectful_functions",
        "empty_like.default",
    )
    offenders = []
    for path in _modules():
        rel = path.relative_to(SRC)
        if rel.parts == ("effects.py",):
            continue
        text = path.read_text()
        offenders += [f"{rel}: {m}" for m in markers if m in text]
    assert not offenders, offenders


def test_benchmarks_and_self_tests_load_only_when_their_command_runs() -> None:
    """`import airstream` and the CLI's parser must not pay for the bench and self-test modules
    (the OpInfo database alone takes seconds to import)."""
    import subprocess
    import sys

    code = (
        "import sys, airstream, airstream.cli\n"
        "airstream.cli.build_parser()\n"
        "heavy = [m for m in sys.modules if m.startswith(('airstream.bench', 'airstream.selftest'))"
        " or m == 'torch.testing._internal.common_methods_invocations']\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def _module_name(path: pathlib.Path) -> str:
    parts = ("airstream", *path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, known: set[str]) -> str | None:
    """The airstream module an import names (``from airstream.x import y`` may name the module
    ``airstream.x.y``)."""
    while module and module not in known:
        module = module.rpartition(".")[0]
    return module or None


def test_every_module_is_named_in_the_layout_doc() -> None:
    """docs/layout.md names every module (its path, or its name under its package's entry)."""
    text = (SRC.parent.parent / "docs" / "layout.md").read_text()
    missing = []
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".py", ".c", ".cpp") or "__pycache__" in path.parts:
            continue
        parts = path.relative_to(SRC).parts
        named = "/".join(parts) in text or (
            len(parts) > 1
            and f"{parts[0]}/" in text
            and ("/".join(parts[-2:]) in text or parts[-1] in text)
        )
        if not named:
            missing.append("/".join(parts))
    assert not missing, f"add to docs/layout.md: {missing}"


def test_no_function_of_the_runtime_or_the_schedule_is_over_60_lines() -> None:
    """The hot path and the planner stay readable: a function over 60 lines is split."""
    long = []
    for package in ("runtime", "schedule"):
        for path in sorted((SRC / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 60:
                        long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({lines})")
    assert not long, long


def test_no_import_circles() -> None:
    """No two modules import each other, directly or through others: counting imports under
    ``if TYPE_CHECKING:`` and inside functions (a lazy import hides a circle, it does not remove
    it). A package's ``__init__`` re-exporting its own modules is not a circle."""
    paths = {_module_name(p): p for p in _modules()}
    known = set(paths)
    edges: dict[str, set[str]] = {m: set() for m in known}
    for module, path in paths.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            dynamic = _dynamic_import(node)
            if dynamic is not None:
                names = [dynamic]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("airstream"):
                names = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
            for name in names:
                target = _resolve(name, known)
                if target is None or target == module or module.startswith(target + "."):
                    continue  # itself, or a package it lives in (Python runs it first anyway)
                if path.name == "__init__.py" and target.startswith(module + "."):
                    continue  # a package re-exporting its own modules
                edges[module].add(target)
    # Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(known):
        if v not in index:
            visit(v)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)
