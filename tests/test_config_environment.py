"""The environment variables airstream reads: one declared table, one checking accessor, and one
cache directory that the handoff extension, the dump manifests and the calibration agree on."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from airstream import ConfigError
from airstream.debug import dump
from airstream.machine import calibration, environment
from airstream.machine.cache_dir import cache_root
from airstream.runtime import handoff

SRC = Path(environment.__file__).parent


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` or a bare ``environ``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name)
    return isinstance(node, ast.Name) and node.id == "environ"


def _names_read(tree: ast.Module) -> set[str]:
    """Variable names read with ``os.environ.get("X")``, ``os.getenv("X")``, ``os.environ["X"]``."""
    found = set()
    for node in ast.walk(tree):
        key: ast.AST | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr == "getenv" or (
                node.func.attr == "get" and _is_environ(node.func.value)
            ):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice if _is_environ(node.value) else None
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.add(key.value)
    return found


def test_every_variable_airstream_reads_is_declared() -> None:
    read = {
        name: str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        for name in _names_read(ast.parse(path.read_text()))
    }
    undeclared = {
        name: where
        for name, where in read.items()
        if name not in environment.VARIABLES and name not in environment.OPENMP
    }
    assert not undeclared, f"declare these in airstream/machine/environment.py: {undeclared}"


def test_the_table_says_what_each_variable_is() -> None:
    for name, variable in environment.VARIABLES.items():
        assert variable.name == name and getattr(environment, name) is variable
        assert variable.allowed and variable.doc and variable.readers and variable.owner
    assert set(environment.OPENMP) == {
        "OMP_NUM_THREADS",
        "OMP_WAIT_POLICY",
        "GOMP_SPINCOUNT",
        "KMP_BLOCKTIME",
    }


@pytest.mark.parametrize(
    ("name", "default"),
    [
        ("AIRSTREAM_CACHE_DIR", None),
        ("XDG_CACHE_HOME", None),
        ("AIRSTREAM_HANDOFF", "auto"),
        ("AIRSTREAM_COSTS", "measured"),
        ("TORCHDYNAMO_VERBOSE", False),
        ("TORCH_COMPILE_DEBUG", False),
    ],
)
def test_unset_or_blank_means_the_default(
    name: str, default: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(name, raising=False)
    assert environment.read(name) == default
    monkeypatch.setenv(name, "  ")
    assert environment.read(name) == default


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("AIRSTREAM_COSTS", "'measured', 'nominal'"),
        ("AIRSTREAM_HANDOFF", "'auto', 'threads', 'locks'"),
    ],
)
def test_a_bad_value_names_the_variable_and_its_values(
    name: str, allowed: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, "bogus")
    with pytest.raises(ConfigError) as info:
        environment.read(name)
    message = str(info.value)
    assert f"invalid value 'bogus' for environment variable {name}" in message
    assert f"allowed values: {allowed}" in message


def test_words_are_read_stripped_and_in_lower_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRSTREAM_HANDOFF", " Locks\n")
    assert environment.AIRSTREAM_HANDOFF.read() == "locks"
    assert handoff._choice() == "locks"
    monkeypatch.setenv("AIRSTREAM_COSTS", "NOMINAL")
    assert environment.AIRSTREAM_COSTS.read() == "nominal"


def test_torchs_flags_are_read_as_torch_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TORCHDYNAMO_VERBOSE", "TORCH_COMPILE_DEBUG"):
        monkeypatch.setenv(name, "1")
        assert environment.read(name) is True
        for other in ("0", "true", "2"):  # never rejected: torch accepts them
            monkeypatch.setenv(name, other)
            assert environment.read(name) is False


def test_a_bad_costs_variable_stops_the_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRSTREAM_COSTS", "bogus")
    with pytest.raises(ConfigError, match="environment variable AIRSTREAM_COSTS"):
        calibration.machine_costs()
    assert calibration.machine_costs("nominal") is calibration.NOMINAL  # an argument wins


def test_an_undeclared_name_is_refused() -> None:
    with pytest.raises(KeyError, match="not an environment variable airstream declares"):
        environment.read("AIRSTREAM_NOPE")


def _sites(directory: Path) -> list[Path]:
    """airstream's cache directory as each of its three users finds it."""
    return [
        handoff._cache_dir(),
        Path(dump._manifest(str(directory))).parent.parent,
        calibration.cache_path().parent,
    ]


def test_one_cache_directory_for_all_its_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("AIRSTREAM_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_root() == home / ".cache" / "airstream"
    assert _sites(tmp_path) == [cache_root()] * 3
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "airstream"
    assert _sites(tmp_path) == [cache_root()] * 3
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"  # used as given: no airstream/ folder added
    assert _sites(tmp_path) == [cache_root()] * 3
    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", "")  # empty: unset
    assert cache_root() == tmp_path / "xdg" / "airstream"
