"""The boundary for torch internals: every probe passes on this torch, nothing else touches them,
and a torch without one is a clear error (at the first compile, never a silent fallback)."""

from __future__ import annotations

import ast
import dataclasses
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tests.conftest import cause_of

import airstream
from airstream import torch_internals
from airstream.errors import TorchSupportError
from airstream.torch_internals import registry

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

ROOT = Path(__file__).resolve().parents[1]
BOUNDARY = ROOT / "src" / "airstream" / "torch_internals"
TORCH_ROOTS = frozenset({"torch", "functorch"})


@pytest.mark.parametrize("name", list(torch_internals.FEATURES), ids=str)
def test_probe(name: str) -> None:
    """Each private API airstream uses exists in this torch as airstream uses it (the test id is
    the feature; its ``api`` names the exact private names)."""
    result = torch_internals.probe(name)
    assert result.problem is None, f"{result.feature.api}: {result.problem}"


def test_every_group_is_required_somewhere() -> None:
    """Each feature group is checked where its functionality starts, so a missing feature is
    reported when first needed rather than as an unrelated traceback."""
    used = {f.group for f in torch_internals.FEATURES.values()}
    required = set()
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", None)) == "require"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                required.add(node.args[0].value)
    # import: checked when airstream is imported; testing: by the tests that use them;
    # diagnostics: reporting only, a missing one warns and reports "unknown"; kernels-without-gil:
    # optional, a missing one warns and the kernels hold the GIL (tests/test_kernel_gil.py)
    optional = {"import", "testing", "diagnostics", "kernels-without-gil"}
    assert used - optional <= required, used - required
    assert required <= set(torch_internals.GROUPS), required


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _private_chain(parts: list[str]) -> bool:
    """A private component in a dotted torch name; aten operators (``torch.ops.aten._to_copy``)
    are public ops whatever their names."""
    if parts[:3] == ["torch", "ops", "aten"]:
        return False
    return any(_private(p) for p in parts)


PRIVATE_PATH = re.compile(r"(torch|functorch)(\.\w+)+")  # a module path in a string


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"] for a chain rooted at a name; None otherwise."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def internals_used(path: Path) -> Iterator[str]:
    """Every use of a torch internal in ``path``: private torch modules and attributes, private
    attributes known to be torch's, and torch's node-meta keys."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = set(TORCH_ROOTS)
    for node in ast.walk(tree):  # names bound to torch modules: `import torch.fx as fx`
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in TORCH_ROOTS:
                    aliases.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in TORCH_ROOTS:
            aliases |= {a.asname or a.name for a in node.names}
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in TORCH_ROOTS and any(_private(p) for p in parts):
                    yield f"{where} import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] in TORCH_ROOTS and (
                any(_private(p) for p in parts) or any(_private(a.name) for a in node.names)
            ):
                yield f"{where} from {node.module} import ..."
        elif isinstance(node, ast.Attribute):
            chain = _chain(node)
            if node.attr in torch_internals.PRIVATE_ATTRIBUTES:
                yield f"{where} .{node.attr}"
            elif chain and chain[0] in aliases and _private(node.attr) and _private_chain(chain):
                yield f"{where} {'.'.join(chain)}"
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
            "getattr",
            "hasattr",
        ):
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
                name = node.args[1].value
                chain = _chain(node.args[0])
                if name in torch_internals.PRIVATE_ATTRIBUTES or (
                    chain and chain[0] in aliases and isinstance(name, str) and _private(name)
                ):
                    yield f"{where} getattr(..., {name!r})"
        elif isinstance(node, ast.Constant) and id(node) not in docstrings:
            if node.value in torch_internals.TORCH_META_KEYS:
                yield f"{where} {node.value!r}"
            elif (
                isinstance(node.value, str)
                and PRIVATE_PATH.fullmatch(node.value)
                and _private_chain(node.value.split("."))
            ):
                yield f"{where} {node.value!r}"  # importlib.import_module("torch._...")


def test_nothing_outside_the_boundary_touches_torch_internals() -> None:
    # tests/torchair ports TorchAir's own tests, which use torch internals as upstream writes
    # them (functionalization kernels, _is_alias_of); airstream's code and tests stay inside.
    ported = ROOT / "tests" / "torchair"
    files = [
        p
        for folder in ("src", "tests", "examples")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if BOUNDARY not in p.parents and ported not in p.parents
    ]
    assert len(files) > 50
    found = [f"{path.parent.name}/{use}" for path in files for use in internals_used(path)]
    assert not found, (
        "torch internals outside src/airstream/torch_internals/ (add an accessor and a "
        "feature there):\n" + "\n".join(found)
    )


def test_the_scan_finds_each_kind_of_use(tmp_path: Path) -> None:
    """The boundary check is not vacuous: each kind of use is caught."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch\n"
        "import torch._dynamo\n"
        "from torch._inductor import config\n"
        "from torch.utils import _pytree\n"
        "import torch.fx as fx\n"
        "x = torch._C._set_grad_enabled\n"
        "y = fx._symbolic_trace\n"
        "z = torch.ops.aten.mm.default._schema\n"
        "w = getattr(op, '_opname')\n"
        "node.meta['partitioner_tag'] = 'must_be_in_forward'\n"
        "ok = torch.__version__\n"
        "fine = torch.ops.aten._to_copy.default\n"
        "m = importlib.import_module('torch._inductor.config')\n"
    )
    found = list(internals_used(sample))
    lines = sorted(int(f.split(":")[1].split()[0]) for f in found)
    assert lines == [2, 3, 4, 6, 6, 7, 8, 9, 10, 10, 13], found


def test_supported_range_is_the_declared_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_dep = [d for d in project["dependencies"] if re.match(r"torch\b", d)]
    assert torch_dep == [f"torch{torch_internals.SUPPORTED_TORCH}"]
    assert torch_internals.support_problem() is None, "the tests run on a supported torch"
    readme = (ROOT / "README.md").read_text()
    for version in torch_internals.TESTED_TORCH:
        assert f"torch=={version}" in readme, f"README names the tested torch {version}"


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("2.11.0+cu130", True),
        ("2.12.1", True),
        ("2.13.0+cpu", True),
        ("2.15.0", True),
        ("2.15.2", True),
        ("2.10.2", False),
        ("2.16.0.dev20261201", False),
        ("3.0.0", False),
    ],
)
def test_support_range(version: str, supported: bool) -> None:
    problem = torch_internals.support_problem(version)
    assert (problem is None) == supported
    if problem is not None:
        assert torch_internals.SUPPORTED_TORCH in problem and version in problem


def _break(feature: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``feature`` look missing, as on a torch that moved it."""

    def missing() -> None:
        raise AttributeError("module 'torch._fake' has no attribute 'moved'")

    original = torch_internals.FEATURES[feature]
    monkeypatch.setitem(
        torch_internals.FEATURES,
        feature,
        torch_internals.Feature(
            original.name, original.api, original.group, original.purpose, missing
        ),
    )
    monkeypatch.delitem(registry._resolved, feature, raising=False)
    monkeypatch.setattr(registry, "_required", set())


def test_a_missing_core_feature_fails_the_first_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    _break("partitioner", monkeypatch)
    compiled = torch.compile(torch.nn.Linear(3, 3), backend=airstream.get_backend())
    with pytest.raises(Exception) as info:
        compiled(torch.randn(2, 3))
    error = cause_of(info.value, TorchSupportError)
    assert isinstance(error, TorchSupportError), info.value
    message = str(error)
    assert "min_cut_rematerialization_partition" in message
    assert torch.__version__ in message and torch_internals.SUPPORTED_TORCH in message
    assert "airstream doctor" in message and error.feature == "partitioner"


def test_a_missing_inductor_feature_is_an_error_not_an_aten_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _break("inductor_compile", monkeypatch)
    monkeypatch.setattr(registry, "_required", set())
    config = airstream.CompilerConfig()
    config.mode = "max-autotune"
    compiled = torch.compile(lambda x: (x.sin() + 1).cos(), backend=airstream.get_backend(config))
    with pytest.raises(Exception) as info:
        compiled(torch.randn(4))
    error = cause_of(info.value, TorchSupportError)
    assert isinstance(error, TorchSupportError), info.value
    assert "compile_fx_inner" in str(error) and error.feature == "inductor_compile"


def test_require_lists_every_missing_feature_of_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    _break("aot_autograd", monkeypatch)
    _break("partitioner", monkeypatch)
    with pytest.raises(TorchSupportError) as info:
        torch_internals.require("core")
    message = str(info.value)
    assert "aot_module_simplified" in message and "min_cut_rematerialization_partition" in message
    assert info.value.feature == "aot_autograd, partitioner"


def test_a_missing_python_package_is_named_with_its_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A probe that fails because a package (not torch) is absent says to install that package,
    not to change torch (numpy missing made the OpInfo probe fail that way)."""

    def needs_numpy() -> None:
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    original = torch_internals.FEATURES["opinfo"]
    monkeypatch.setitem(
        torch_internals.FEATURES, "opinfo", dataclasses.replace(original, probe=needs_numpy)
    )
    monkeypatch.delitem(registry._resolved, "opinfo", raising=False)
    monkeypatch.setattr(registry, "_required", set())
    with pytest.raises(TorchSupportError) as info:
        torch_internals.opinfo_database()
    message = str(info.value)
    assert "the Python package 'numpy' is not installed" in message
    assert "pip install numpy" in message and "pip install 'torch" not in message
    with pytest.raises(TorchSupportError, match="pip install numpy"):
        torch_internals.require("selftest")


def test_the_replay_check_has_a_python_form_for_builds_without_cuda() -> None:
    """CPU builds lack torch._C._tensors_data_ptrs_at_indices_equal; the loop used there gives
    the same answers as the check this build uses (the C one on CUDA builds)."""
    from airstream.torch_internals import cuda

    a, b = torch.zeros(2), torch.ones(2)
    cases = [
        ([a, b], [a.data_ptr(), b.data_ptr()], [0, 1], True),
        ([a, b], [a.data_ptr(), a.data_ptr()], [0, 1], False),
        ([a, b], [a.data_ptr(), a.data_ptr()], [0], True),  # only the indices listed
        ([a, b], [None, b.data_ptr()], [1], True),
        ([a], [b.data_ptr()], [0], False),
    ]
    for tensors, data_ptrs, indices, want in cases:
        assert cuda._data_ptrs_equal_in_python(tensors, data_ptrs, indices) is want
        assert cuda.data_ptrs_equal(tensors, data_ptrs, indices) is want
