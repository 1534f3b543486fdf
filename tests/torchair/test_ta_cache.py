"""Ports of TorchAir's aclgraph ``cache_compile`` tests (``tests/st/torchair_aclgraph_st.py``):
the entry appears where ``CompiledModel.get_cache_bin`` says, a second model's calls load it
without compiling (``ModelCacheSaver.__call__`` forbidden), and results equal eager's. Beyond
upstream: a new process loads the entry (the point of the cache), and a file that is not an entry
is compiled over with one warning.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.torchair.conftest import upstream
from torchair.configs.compiler_config import CompilerConfig
from torchair.inference._cache_compiler import CompiledModel, ModelCacheSaver

import torchair

ST = "tests/st/torchair_aclgraph_st.py::"


@contextlib.contextmanager
def forbidden_attr(owner: Any, name: str) -> Iterator[None]:
    """``owner.name`` raises while the block runs (upstream's helper, written here)."""
    saved = getattr(owner, name)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{owner.__name__}.{name} must not be called here")

    setattr(owner, name, refuse)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _config() -> CompilerConfig:
    config = CompilerConfig()
    config.mode = "reduce-overhead"
    config.debug.aclgraph.clone_input = False
    config.debug.aclgraph.disable_reinplace_inplaceable_ops_pass = True
    return config


class Model(torch.nn.Module):
    def __init__(self, config: CompilerConfig, cache_dir: str) -> None:
        super().__init__()
        self.linear1 = torch.nn.Linear(2, 2)
        self.linear2 = torch.nn.Linear(2, 2)
        self.cached_prompt = torchair.inference.cache_compile(
            self.prompt, config=config, cache_dir=cache_dir
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cached_prompt(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear1(x) + self.linear2(x)

    def prompt(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(x)


@upstream(ST + "test_aclgraph_cache")
def test_aclgraph_cache(tmp_path: Path) -> None:
    # upstream: the entry's directory appears on the first call, stays on the second, and a
    # second model's calls hit it (ModelCacheSaver.__call__ forbidden); here also: results
    config = _config()
    model = Model(config, str(tmp_path))
    cache_bin = CompiledModel.get_cache_bin(model.prompt, config=config, cache_dir=str(tmp_path))
    cache_dir = os.path.dirname(cache_bin)
    ModelCacheSaver.remove_cache(cache_dir)
    x = torch.randn([3, 2])
    assert not os.path.exists(cache_dir)
    torch.testing.assert_close(model(x), model._forward(x))
    assert os.path.exists(cache_bin)  # cache compiled
    model(x)
    assert os.path.exists(cache_bin)  # not recompiled
    assert cache_bin.endswith(os.path.join("prompt", "compiled_module"))
    assert os.path.basename(os.path.dirname(os.path.dirname(cache_bin))).startswith(
        "Model_dynamic_aclgraphcache_"
    )

    again = Model(config, str(tmp_path))
    again.load_state_dict(model.state_dict())
    with forbidden_attr(ModelCacheSaver, "__call__"):
        torch.testing.assert_close(again(x), model._forward(x))  # cache hit
        torch.testing.assert_close(again(x), model._forward(x))
    assert again.cached_prompt.cached.loaded


def _run_example(cwd: Path) -> subprocess.CompletedProcess[str]:
    script = Path(__file__).resolve().parents[2] / "examples" / "torchair_cache_compile.py"
    return subprocess.run(
        [sys.executable, "-m", "airstream.cli", "run", "--torchair", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=cwd,
    )


def test_the_guide_script_checks_its_cache_and_the_next_run_loads_it(tmp_path: Path) -> None:
    # the Done-when of issue 31: TorchAir's guide script, unchanged, under airstream run
    first = _run_example(tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "compiled and saved the cache" in first.stdout
    entries = list(
        (tmp_path / ".torchair_cache").glob("Model_dynamic_aclgraphcache_*/*/compiled_module")
    )
    assert sorted(p.parent.name for p in entries) == ["decode", "prompt"]
    second = _run_example(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "the cache was there before this run (loaded)" in second.stdout
    assert "cache_compile" not in second.stderr  # no stale or unreadable entry


def test_a_file_that_is_not_an_entry_is_compiled_over(tmp_path: Path) -> None:
    config = _config()
    model = Model(config, str(tmp_path))
    cache_bin = Path(
        CompiledModel.get_cache_bin(model.prompt, config=config, cache_dir=str(tmp_path))
    )
    cache_bin.parent.mkdir(parents=True)
    cache_bin.write_bytes(b"written by TorchAir on an NPU")
    x = torch.randn(3, 2)
    with pytest.warns(UserWarning, match="has no readable record") as record:
        torch.testing.assert_close(model(x), model._forward(x))
    assert len([w for w in record if "cache_compile" in str(w.message)]) == 1
    assert not model.cached_prompt.cached.loaded
    again = Model(config, str(tmp_path))
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again(x), model._forward(x))
    assert again.cached_prompt.cached.loaded  # the entry written over it loads


def test_cache_compile_refuses_what_torchair_refuses(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Only method can be cached now"):
        torchair.inference.cache_compile(lambda x: x)
    with pytest.raises(ValueError, match="Only torch.nn.Module method can be cached now"):
        torchair.inference.cache_compile(Path(".").exists)
    with pytest.raises(ValueError, match="config in current backend is different"):
        model = torch.nn.Linear(2, 2)
        torchair.inference.cache_compile(
            model.forward, config=_config(), backend=torchair.get_npu_backend(_config())
        )


def test_readable_cache_names_what_the_entry_holds(tmp_path: Path) -> None:
    config = _config()
    model = Model(config, str(tmp_path))
    model(torch.randn(3, 2))
    cache_bin = CompiledModel.get_cache_bin(model.prompt, config=config, cache_dir=str(tmp_path))
    text = torchair.inference.readable_cache(cache_bin, print_output=False)
    assert re.search(r"^function: [\w.]*test_ta_cache\.Model\.prompt$", text, re.M)
    assert re.search(r"^traced: [\w.]*test_ta_cache lines \d+-\d+$", text, re.M)
    assert f"compiled file: {cache_bin}" in text


def _inf(self: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    return x + y, y + float("inf")


def _nan(self: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    return x + y, y + float("nan")


def _tensor_constant(self: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    x = x + y
    return torch.maximum(x, torch.tensor(torch.finfo(x.dtype).min, device=x.device))


def _record_wait(self: Any, x: torch.Tensor, y: torch.Tensor) -> Any:
    mm = torch.mm(x, x)
    with torchair.scope.npu_stream_switch("1", 3):
        torchair.ops.wait([mm])
        abs1 = torch.abs(mm)
        add1 = torch.add(abs1, 1)
    with torchair.scope.npu_stream_switch("2", 3):
        torchair.ops.wait([mm, abs1])
        sub = torch.sub(add1, mm)
    return sub + y


class Bodies(torch.nn.Module):
    """Upstream's models, one ``_forward`` each, compiled through cache_compile's default
    directory (./.torchair_cache)."""

    def __init__(self, body: Any) -> None:
        super().__init__()
        self.body = body
        self.cached_prompt = torchair.inference.cache_compile(self.prompt, config=_config())

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return self.cached_prompt(x, y)

    def prompt(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return self.body(self, x, y)


@upstream(
    ST + "test_aclgraph_cache_closure_vars",
    ST + "test_aclgraph_cache_with_nan",
    ST + "test_aclgraph_cache_tensor_constant",
    ST + "test_aclgraph_cache_with_record_wait",
)
@pytest.mark.parametrize("body", [_inf, _nan, _tensor_constant, _record_wait])
def test_aclgraph_cache_bodies(body: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # upstream: compiled on the first call, not again on the second, a second model hits the
    # cache; here also the results against eager (NaN and inf kept), streams included
    monkeypatch.chdir(tmp_path)
    model = Bodies(body)
    cache_bin = CompiledModel.get_cache_bin(model.prompt, config=_config())
    assert cache_bin.startswith(str(tmp_path / ".torchair_cache"))
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    want = body(model, x, y)
    torch.testing.assert_close(model(x, y), want, equal_nan=True)
    assert os.path.exists(cache_bin)
    again = Bodies(body)
    with forbidden_attr(ModelCacheSaver, "__call__"):
        torch.testing.assert_close(again(x, y), want, equal_nan=True)
        torch.testing.assert_close(again(x, y), want, equal_nan=True)
    assert again.cached_prompt.cached.loaded
