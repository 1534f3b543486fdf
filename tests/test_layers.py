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
                "calibration",
                "openmp",
                "launch",
                "torch_internals",
                "options",
                "config",
                "ops",
                "effects",
                "nodes",
                "streams",
                "decompositions",
            }
        ),
    ),
    ("passes", frozenset({"passes"})),
    ("schedule", frozenset({"schedule"})),
    ("runtime", frozenset({"runtime"})),
    ("observers", frozenset({"observers", "debug"})),
    ("backend", frozenset({"backend"})),
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
                "examples",
                "__main__",
            }
        ),
    ),
)


def _layer(part: str) -> int:
    for index, (_, parts) in enumerate(LAYERS):
        if part in parts:
            return index
    raise AssertionError(f"airstream.{part} is in no layer of tests/test_layers.py: add it")


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every airstream import outside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
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
        _layer(path.relative_to(SRC).parts[0].removesuffix(".py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_runs_upward(path: pathlib.Path) -> None:
    part = path.relative_to(SRC).parts[0].removesuffix(".py")
    own = _layer(part)
    tree = ast.parse(path.read_text())
    upward = []
    for line, module in _runtime_imports(tree):
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
    markers = ("nondeterministic_seeded", ".is_mutable", "alias_info")
    allowed = {"effects.py", "torch_internals"}
    offenders = []
    for path in _modules():
        rel = path.relative_to(SRC)
        if rel.parts[0] in allowed:
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
