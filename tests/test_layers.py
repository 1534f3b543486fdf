"""The module layers of docs/design.md: no import runs from a lower layer to a higher one, and no
module but ``airstream.graph.effects`` reads an op's schema or tags to decide its effects."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

SRC = pathlib.Path(__file__).resolve().parent.parent / "src" / "airstream"

# Lowest first: the top level's folders and modules. A module may import its own layer and any
# layer below it. Each folder's ``__init__`` docstring says its layer and what it imports
# (test_each_folder_says_its_layer_and_what_it_imports).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"errors", "torch_internals", "options", "machine", "ops", "graph"})),
    # the planner: what a placement costs in syncs is its answer, which the automatic passes ask
    ("planner", frozenset({"schedule.deps", "schedule.plan", "schedule.overlap"})),
    ("passes", frozenset({"passes"})),
    ("schedule", frozenset({"schedule"})),
    ("runtime", frozenset({"runtime"})),
    ("observers", frozenset({"debug"})),
    ("backend", frozenset({"compiler", "backend"})),
    (
        "applications",
        frozenset(
            {
                "__init__",
                "__main__",
                "_moved",
                "inductor",
                "caching",
                "cli",
                "bench",
                "selftest",
                "compat",
                "examples",
            }
        ),
    ),
)

# What the top level of src/airstream holds besides its folders: the public entry points.
TOP_MODULES = {"__init__", "__main__", "_moved", "backend", "errors", "inductor"}


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
    """Mutation, aliasing and randomness are decided in airstream.graph.effects alone."""
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
        if rel.parts == ("graph", "effects.py"):
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


def _folders() -> list[pathlib.Path]:
    return sorted(p.parent for p in SRC.glob("*/__init__.py"))


def test_the_top_level_holds_the_entry_points_and_the_folders() -> None:
    """A new module goes into the folder of its concern, not beside the entry points."""
    modules = {p.stem for p in SRC.glob("*.py")}
    assert modules == TOP_MODULES, f"move {sorted(modules - TOP_MODULES)} into a folder"
    for folder in _folders():
        assert _layer(folder.name) >= 0  # every folder is in a layer (raises otherwise)


def _declared(folder: pathlib.Path) -> tuple[str, set[str]]:
    """The layer and imports a folder's ``__init__`` docstring names: ``Layer: base. May import:
    errors, torch_internals.`` (``airstream`` is the package root)."""
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    flat = " ".join(doc.split())
    layer = re.search(r"Layer: (\w+)", flat)
    imports = re.search(r"May import: ([\w, ]*)\.", flat)
    assert layer and imports, (
        f"{folder.name}/__init__.py: its docstring ends with 'Layer: <layer>. May import: <folders "
        "and modules of the top level>.'"
    )
    names = {n.strip() for n in imports.group(1).split(",") if n.strip() and n.strip() != "nothing"}
    return layer.group(1), names


@pytest.mark.parametrize("folder", _folders(), ids=lambda p: p.name)
def test_each_folder_says_its_layer_and_what_it_imports(folder: pathlib.Path) -> None:
    layer, declared = _declared(folder)
    assert layer == LAYERS[_layer(folder.name)][0], f"{folder.name} is in another layer"
    actual = set()
    for path in sorted(folder.rglob("*.py")):
        for _, module in _imports(ast.parse(path.read_text())):
            top = _top(module).split(".")[0]
            if top != folder.name:
                actual.add("airstream" if top == "__init__" else top)
    assert actual == declared, (
        f"{folder.name}/__init__.py says it may import {sorted(declared)}; its modules import "
        f"{sorted(actual)}: change the imports or the docstring"
    )
    for name in declared - {"airstream"}:
        if folder.name != "passes" or name != "schedule":  # the planner, below the passes
            assert _layer(name) <= _layer(folder.name), f"{folder.name} imports {name} above it"


def test_old_module_paths_resolve_to_the_new_ones_with_a_warning() -> None:
    """The flat layout's paths a user may have imported keep working (airstream._moved), and no
    airstream code or test uses them."""
    import importlib
    import subprocess
    import sys

    from airstream import _moved

    for old, new in _moved.MOVED.items():
        assert importlib.util.find_spec(new) is not None, f"{old} -> {new}, which does not exist"
    code = (
        "import warnings, airstream\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from airstream.config import CompilerConfig\n"
        "    import airstream.streams\n"
        "    from airstream.options import Option\n"
        "import airstream.options.config, airstream.graph.streams, airstream.options.schema\n"
        "assert CompilerConfig is airstream.options.config.CompilerConfig\n"
        "assert airstream.streams is airstream.graph.streams\n"
        "assert Option is airstream.options.schema.Option\n"
        "print('|'.join(str(w.message) for w in caught))\n"
        "try:\n"
        "    import airstream.explain\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
        "assert callable(airstream.explain)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    said, gone = out.stdout.strip().splitlines()
    assert said.split("|") == [
        "airstream.config moved to airstream.options.config: import it from there",
        "airstream.streams moved to airstream.graph.streams: import it from there",
        "airstream.options.Option moved to airstream.options.schema.Option: import it from there",
    ]
    assert "airstream.cli.explain" in gone
    old = re.compile(r"airstream\.(" + "|".join(m.split(".")[1] for m in _moved.MOVED) + r")\b")
    users = []
    for path in [*_modules(), *sorted((SRC.parent.parent / "tests").rglob("*.py"))]:
        if path.name in ("_moved.py", "test_layers.py"):
            continue
        for line_no, module in _imports(ast.parse(path.read_text())):
            if old.fullmatch(module) and module != "airstream.options":
                users.append(f"{path}:{line_no} imports {module}")
    assert not users, users
