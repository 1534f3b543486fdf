"""airstream.cache_compile: a function compiled once, saved, and loaded by the next process.

Each new-process test runs a small program (written to tmp_path with the model it compiles)
twice or more with the same cache directory: the first compiles and saves, the next loads. The
program prints what it saw: whether its entry loaded, whether the user's pass ran, whether the
graph it runs holds the pass's stream block, and the result, checked against eager there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import slow

import airstream
from airstream import torch_internals
from airstream.compiler.cache_key import pass_identity

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

_MODEL = """
import torch

def scale(x):
    return x * 2

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return scale(torch.relu(self.linear(x))) + torch.sin(x)
"""

_PROGRAM = """
import json, sys, warnings
import torch, airstream, airstream.compiler.measuring as measuring
from model import Model

ran, graphs = [], []
def side_stream(gm, example_inputs, config):
    ran.append(1)
    sin = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.sin.default)
    with gm.graph.inserting_before(sin):
        gm.graph.call_function(torch.ops.air.scope_enter, (["_user_stream_label"], ["s1"]))
    with gm.graph.inserting_after(sin):
        gm.graph.call_function(torch.ops.air.scope_exit, ())
    gm.recompile()

finish = measuring.finish_graph
def record(gm, *args, **kwargs):
    graphs.append([str(n.target) for n in gm.graph.nodes])
    return finish(gm, *args, **kwargs)
measuring.finish_graph = record  # what compiling and loading both finish with

torch.manual_seed(0)
model = Model()
config = airstream.CompilerConfig()
config.post_grad_custom_pre_pass = side_stream
fn = airstream.cache_compile(model.forward, config=config, cache_dir=sys.argv[1])
shapes = [int(s) for s in sys.argv[2].split(",")]
with warnings.catch_warnings(record=True) as caught, torch.no_grad():
    warnings.simplefilter("always")
    for rows in shapes:
        x = torch.randn(rows, 8)
        torch.testing.assert_close(fn(x), model(x))
print(json.dumps({
    "loaded": fn.loaded,
    "pass_ran": len(ran),
    "stream_block": any("air.scope_enter" in t for g in graphs for t in g),
    "warnings": [str(w.message) for w in caught if "cache_compile" in str(w.message)],
}))
"""


def _setup(tmp_path: Path) -> Path:
    (tmp_path / "model.py").write_text(textwrap.dedent(_MODEL))
    (tmp_path / "program.py").write_text(textwrap.dedent(_PROGRAM))
    return tmp_path / "cache"


def _run(tmp_path: Path, shapes: str = "4") -> dict[str, Any]:
    # Inductor's and AOTAutograd's caches too are the test's own: AOTAutograd would serve an
    # entry an earlier run made for the same key (correctly, but the pass would not run)
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
    }
    result = subprocess.run(
        [sys.executable, str(tmp_path / "program.py"), str(tmp_path / "cache"), shapes],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _entry(cache: Path) -> Path:
    (binary,) = cache.glob("*/compiled.bin")
    return binary


def test_a_new_process_loads_the_entry_and_skips_the_passes(tmp_path: Path) -> None:
    cache = _setup(tmp_path)
    first = _run(tmp_path)
    assert first == {"loaded": False, "pass_ran": 1, "stream_block": True, "warnings": []}
    second = _run(tmp_path)
    # loaded: the user's pass did not run, and the graph rebuilt holds its stream block
    assert second == {"loaded": True, "pass_ran": 0, "stream_block": True, "warnings": []}
    record = json.loads(_entry(cache).with_name("compiled.bin.json").read_text())
    assert record["key"]["function"] == "model.Model.forward"
    assert any(m == "model" for m, *_ in record["sources"])


_DECORATED_MODEL = """
import functools

import torch


def keeps_tuple(func):  # as transformers' decorators: the wrapper holds the method in a cell
    @functools.wraps(func)
    def wrapper(self, *args, return_dict=True, **kwargs):
        out = func(self, *args, **kwargs)
        if func.__name__ == "forward" and not return_dict:  # reads the method it wraps
            return (out,)
        return out

    return wrapper


def scale(x):
    return x * 2


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    @keeps_tuple
    def forward(self, x):
        return scale(torch.relu(self.linear(x))) + torch.sin(x)
"""


def test_a_decorated_method_is_saved_and_loaded(tmp_path: Path) -> None:
    # pickle cannot find the wrapped method by name (the name finds the wrapper), and a guard on
    # the wrapper's cell cannot be read by a loaded function: both were saved as the fix says
    # (tests/test_compile_cache_models.py runs transformers' own forwards)
    _setup(tmp_path)
    (tmp_path / "model.py").write_text(textwrap.dedent(_DECORATED_MODEL))
    if torch_internals.torch_release() < (2, 12, 0):  # what 2.11 cannot save runs in-process
        first = _run(tmp_path)
        assert first["loaded"] is False and len(first["warnings"]) <= 1
        return
    assert _run(tmp_path) == {"loaded": False, "pass_ran": 1, "stream_block": True, "warnings": []}
    assert _run(tmp_path) == {"loaded": True, "pass_ran": 0, "stream_block": True, "warnings": []}


def test_a_changed_source_is_compiled_again_with_one_warning(tmp_path: Path) -> None:
    _setup(tmp_path)
    _run(tmp_path)
    model = tmp_path / "model.py"
    model.write_text(model.read_text().replace("return x * 2", "return x * 3"))
    stale = _run(tmp_path)  # the program checks the result against eager: x * 3
    assert not stale["loaded"] and stale["pass_ran"] == 1
    assert len(stale["warnings"]) == 1
    assert "is stale: the source it traced at model:" in stale["warnings"][0]


@slow(
    "two compiles in one process, then a load of both (20 s)",
    "tests/test_compile_cache.py::test_in_process_results_and_a_second_shape",
)
def test_each_input_shape_has_its_own_entry(tmp_path: Path) -> None:
    cache = _setup(tmp_path)
    assert not _run(tmp_path, "4,6")["loaded"]
    assert len(list(cache.glob("*/compiled.bin"))) == 2
    again = _run(tmp_path, "4,6")
    assert again["loaded"] and again["pass_ran"] == 0 and again["warnings"] == []


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def test_in_process_results_and_a_second_shape(tmp_path: Path) -> None:
    model = Small()
    cached = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    with torch.no_grad():
        for rows in (3, 5):
            x = torch.randn(rows, 8)
            torch.testing.assert_close(cached(x), model(x))
            assert cached.path is not None and cached.path.exists()
    assert len(list(tmp_path.glob("*/compiled.bin"))) == 2


class Branchy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, is_prompt: bool) -> torch.Tensor:
        y = self.linear(x)
        return y * 2 if is_prompt else y - 1


def test_an_input_value_the_trace_branched_on_gets_its_own_entry(tmp_path: Path) -> None:
    model = Branchy()
    cached = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for flag in (True, False, True, False):  # each call takes the branch its flag says
            torch.testing.assert_close(cached(x, flag), model(x, flag))
    assert len(cached._variants) == 2  # both kept in memory: no reload per call
    assert len(list(tmp_path.glob("*/compiled.bin"))) == 2
    again = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(again(x, False), model(x, False))
    assert again.loaded


def test_what_torch_cannot_save_runs_compiled_with_one_warning(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    cached = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    x = torch.randn(3, 8)
    with pytest.warns(UserWarning, match="could not be saved") as record, torch.no_grad():
        torch.testing.assert_close(cached(x), model(x))
        torch.testing.assert_close(cached(x), model(x))
    assert len(record) == 1
    assert "Sequential.forward" in str(record[0].message)
    assert not list(tmp_path.glob("*/compiled.bin"))


_STREAM = torch.Stream(device="cpu")


def _on_the_models_stream(x: torch.Tensor) -> torch.Tensor:
    with _STREAM:  # a torch.Stream object in the graph: airstream cannot pickle it
        y = torch.sin(x) * 2
    return y + 1


def test_a_graph_airstream_cannot_save_runs_compiled_with_one_warning(tmp_path: Path) -> None:
    cached = airstream.cache_compile(_on_the_models_stream, cache_dir=tmp_path)
    x = torch.randn(8)
    with pytest.warns(airstream.CacheWarning) as record, torch.no_grad():
        torch.testing.assert_close(cached(x), torch.sin(x) * 2 + 1)
        torch.testing.assert_close(cached(x), torch.sin(x) * 2 + 1)
    (warning,) = record
    assert re.search(
        r"_on_the_models_stream cannot be compiled ahead of time \(airstream could not save "
        r"the graph: TypeError: cannot pickle 'torch.Stream' object\); it is compiled in this "
        r"process",
        str(warning.message),
    ), str(warning.message)
    assert not list(tmp_path.glob("*/compiled.bin"))


def test_pass_identity_tells_passes_apart() -> None:
    def make(regex: str) -> Any:
        def graph_pass(gm: Any, example_inputs: Any, config: Any) -> None:
            print(regex)

        return graph_pass

    class Inductorish:
        def __init__(self, version: str) -> None:
            self.version = version

        def __call__(self, graph: Any) -> None: ...

        def uuid(self) -> str:
            return self.version

    assert pass_identity(make("a")) == pass_identity(make("a"))
    assert pass_identity(make("a")) != pass_identity(make("b"))  # the values it closes over
    assert pass_identity(lambda g, e, c: None) != pass_identity(lambda g, e, c: g)  # its code
    assert pass_identity(Inductorish("v1")) == "uuid:v1"
    assert pass_identity(Inductorish("v1")) != pass_identity(Inductorish("v2"))


def test_bad_arguments_are_named() -> None:
    with pytest.raises(TypeError, match="takes a function or a bound method"):
        airstream.cache_compile(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be an airstream.CompilerConfig"):
        airstream.cache_compile(torch.sin, config={"mode": "reduce-overhead"})  # type: ignore[arg-type]


def test_what_torch_cannot_compile_ahead_of_time_runs_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airstream import torch_internals
    from airstream.caching import compile_cache

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise torch_internals.package_error()("ID_MATCH guard cannot be serialized.")

    monkeypatch.setattr(compile_cache.torch_internals, "aot_compile", refuse)
    model = Small()
    cached = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    x = torch.randn(3, 8)
    with pytest.warns(UserWarning, match="cannot be compiled ahead of time") as record:
        with torch.no_grad():
            torch.testing.assert_close(cached(x), model(x))
            torch.testing.assert_close(cached(x), model(x))
    assert len(record) == 1
    assert "ID_MATCH guard cannot be serialized" in str(record[0].message)
    assert not list(tmp_path.glob("*/compiled.bin"))


def test_a_different_pass_is_never_served_a_graph_compiled_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the same function and inputs under another pass: neither airstream's entry nor
    # AOTAutograd's own cache (keyed without airstream's options) may serve the first compile.
    # Inductor's cache directory is the test's: an earlier run's entries for the same keys would
    # be served (rightly) and the passes not run.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    ran: list[str] = []

    def first(gm: Any, example_inputs: Any, config: Any) -> None:
        ran.append("first")

    def second(gm: Any, example_inputs: Any, config: Any) -> None:
        ran.append("second")

    model = Small()
    x = torch.randn(3, 8)
    for graph_pass in (first, second):
        config = airstream.CompilerConfig()
        config.post_grad_custom_pre_pass = graph_pass
        cached = airstream.cache_compile(model.forward, config=config, cache_dir=tmp_path)
        with torch.no_grad():
            torch.testing.assert_close(cached(x), model(x))
        assert not cached.loaded
    assert ran == ["first", "second"]
    assert len(list(tmp_path.glob("*/compiled.bin"))) == 2


def test_the_key_sees_what_a_trace_reads_from_the_module() -> None:
    from airstream.compiler.cache_key import cache_key

    model = Small()
    x = torch.randn(3, 8)
    config = airstream.CompilerConfig()

    def key() -> dict[str, Any]:
        return cache_key(model.forward, (x,), {}, config, False)

    base = key()
    model.activation = torch.tanh  # a function chosen at construction
    assert key()["module"] != base["module"]
    del model.activation
    model.eval()
    assert key()["module"] != base["module"]  # training mode
    model.train()
    assert key() == base
    assert (
        cache_key(model.forward, (x.t().contiguous().t(),), {}, config, False)["inputs"]
        != (base["inputs"])
    )  # strides


def test_the_key_sees_only_the_calibration_this_process_decides_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto_streams decides with the figures measured for this machine and thread count: those
    are in the key; a calibration for another thread count is not."""
    import dataclasses

    from airstream.compiler.cache_key import cache_key
    from airstream.machine import calibration

    monkeypatch.setenv("AIRSTREAM_CACHE_DIR", str(tmp_path))
    model, x, config = Small(), torch.randn(3, 8), airstream.CompilerConfig()

    def costs() -> Any:
        return cache_key(model.forward, (x,), {}, config, False)["costs"]

    assert costs()[1] is None, "nothing measured yet"
    other = calibration.identity(torch.get_num_threads() + 1)
    calibration._store(calibration._key(other), other, calibration.NOMINAL)
    assert costs()[1] is None, "another thread count's figures are not this process's"
    here = calibration.identity()
    calibration._store(calibration._key(here), here, calibration.NOMINAL)
    first = costs()[1]
    assert first is not None
    slower = dataclasses.replace(calibration.NOMINAL, sync_seconds=1e-3)
    calibration._store(calibration._key(here), here, slower)
    assert costs()[1] not in (None, first), "measured again: new figures, a new key"


FLAG = False


class Flagged(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * 2 if FLAG else self.linear(x)


def test_a_global_flag_the_trace_read_is_guarded(tmp_path: Path) -> None:
    global FLAG
    model = Flagged()
    cached = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    x = torch.randn(3, 8)
    try:
        with torch.no_grad():
            torch.testing.assert_close(cached(x), model(x))
            FLAG = True
            torch.testing.assert_close(cached(x), model(x))  # not the first trace's branch
    finally:
        FLAG = False
    assert len(cached._variants) == 2


def test_a_binary_its_record_does_not_describe_is_compiled_again(tmp_path: Path) -> None:
    model = Small()
    x = torch.randn(3, 8)
    with torch.no_grad():
        airstream.cache_compile(model.forward, cache_dir=tmp_path)(x)
    (binary,) = tmp_path.glob("*/compiled.bin")
    binary.write_bytes(binary.read_bytes() + b"\0")  # another writer's file
    again = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    with pytest.warns(airstream.CacheWarning, match="is not the file its record describes"):
        with torch.no_grad():
            torch.testing.assert_close(again(x), model(x))
    assert not again.loaded


def test_a_corrupt_entry_is_compiled_again_with_one_warning(tmp_path: Path) -> None:
    model = Small()
    x = torch.randn(3, 8)
    with torch.no_grad():
        airstream.cache_compile(model.forward, cache_dir=tmp_path)(x)
    binary = _entry(tmp_path)
    binary.write_bytes(binary.read_bytes()[:1000])  # unreadable, though its record matches it
    record_file = binary.with_name("compiled.bin.json")
    record = json.loads(record_file.read_text())
    record["sha256"] = hashlib.sha256(binary.read_bytes()).hexdigest()
    record_file.write_text(json.dumps(record))
    again = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    with pytest.warns(airstream.CacheWarning, match="could not be loaded") as caught:
        with torch.no_grad():
            torch.testing.assert_close(again(x), model(x))
    assert len(caught) == 1 and not again.loaded
    assert "compiling Small.forward again and replacing it" in str(caught[0].message)
    third = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(third(x), model(x))
    assert third.loaded  # the entry written over it


def test_an_entry_other_users_can_write_is_not_loaded(tmp_path: Path) -> None:
    model = Small()
    x = torch.randn(3, 8)
    with torch.no_grad():
        airstream.cache_compile(model.forward, cache_dir=tmp_path)(x)
    (binary,) = tmp_path.glob("*/compiled.bin")
    assert binary.stat().st_mode & 0o077 == 0  # written for its owner only
    binary.chmod(0o666)
    again = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    with pytest.warns(airstream.CacheWarning, match="writable by other users") as record:
        with torch.no_grad():
            torch.testing.assert_close(again(x), model(x))
    assert str(record[0].filename) == __file__  # the warning points at the caller's line
    assert not again.loaded


def test_grad_enabled_and_debug_dumps_say_what_they_do(tmp_path: Path) -> None:
    model = Small()
    x = torch.randn(3, 8)
    cached = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    with pytest.warns(airstream.CacheWarning, match="compiled with grad enabled"):
        torch.testing.assert_close(cached(x), model(x))
    config = airstream.CompilerConfig()
    config.debug.run_eagerly = True
    debug = airstream.cache_compile(model.forward, config=config, cache_dir=tmp_path / "debug")
    with pytest.warns(airstream.CacheWarning, match="debug.run_eagerly is set"):
        with torch.no_grad():
            torch.testing.assert_close(debug(x), model(x))
    assert not (tmp_path / "debug").exists()


def test_a_copied_module_says_to_cache_compile_again(tmp_path: Path) -> None:
    import copy

    model = Small()
    model.step = airstream.cache_compile(model.forward, cache_dir=tmp_path)
    twin = copy.deepcopy(model)
    with pytest.raises(RuntimeError, match="call airstream.cache_compile on the copy"):
        twin.step(torch.randn(3, 8))


def test_airstream_cache_lists_and_clears_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airstream.cli import main

    model = Small()
    with torch.no_grad():
        for rows in (3, 5):
            airstream.cache_compile(model.forward, cache_dir=tmp_path)(torch.randn(rows, 8))
    assert main(["cache", "--dir", str(tmp_path)]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith(f"compile cache: {tmp_path}\n")
    assert len(re.findall(r"^  [\w.]*test_compile_cache\.Small\.forward$", listing, re.M)) == 2
    assert "  2 entries, " in listing
    assert main(["cache", "--dir", str(tmp_path), "--clear"]) == 0
    assert capsys.readouterr().out.startswith("removed 2 entries (")
    assert not list(tmp_path.rglob("compiled.bin*"))
    assert main(["cache", "--dir", str(tmp_path)]) == 0
    assert "  0 entries, 0.0 MB" in capsys.readouterr().out
