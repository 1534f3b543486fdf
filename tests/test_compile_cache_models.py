"""airstream.cache_compile on the forward of transformers models, as users call it: a method
under decorators (``can_return_tuple``, ``deprecate_kwarg``: their wrappers hold the method in a
closure cell, which pickle cannot find by name), with ``use_cache`` and without, with a cache
object passed in. Each test runs a program twice with one cache directory: the first process
compiles and saves, the second loads, with no warning, and both match eager (the logits, and
the cache the model filled)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import slow

from airstream import torch_internals

pytest.importorskip("transformers")

pytestmark = pytest.mark.torch_api  # CI runs it on every torch minor (.ci/run)

_PROGRAM = """
import json, sys, warnings
import torch, transformers, airstream
from airstream import passes
from airstream.selftest.architectures import ARCHS

arch, cache_kind = sys.argv[2], sys.argv[3]
model = ARCHS[arch].build()
ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))

def cache():
    if cache_kind == "static":
        return transformers.StaticCache(config=model.config, max_cache_len=16)
    return transformers.DynamicCache(config=model.config)

def call(fn):
    if cache_kind == "none":
        return fn(ids, use_cache=False), None
    if cache_kind == "made":  # use_cache=True, no cache given: the model makes one
        out = fn(ids, use_cache=True)
        return out, out.past_key_values
    given = cache()
    return fn(ids, past_key_values=given, use_cache=True), given

config = airstream.CompilerConfig()
config.post_grad_custom_pre_pass = passes.auto_streams(max_streams=2, min_gain=0)
fn = airstream.cache_compile(model.forward, config=config, cache_dir=sys.argv[1])
with warnings.catch_warnings(record=True) as caught, torch.no_grad():
    warnings.simplefilter("always")
    got, got_cache = call(fn)
    want, want_cache = call(model.forward)
torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
if want_cache is not None:
    for mine, theirs in zip(got_cache.layers, want_cache.layers, strict=True):
        torch.testing.assert_close(mine.keys, theirs.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(mine.values, theirs.values, rtol=1e-4, atol=1e-4)
print(json.dumps({
    "loaded": fn.loaded,
    "warnings": [str(w.message) for w in caught if "cache_compile" in str(w.message)],
}))
"""


def _run(tmp_path: Path, arch: str, cache_kind: str) -> dict[str, Any]:
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(_PROGRAM))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    result = subprocess.run(
        [sys.executable, str(program), str(tmp_path / "cache"), arch, cache_kind],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return report


def _saves_and_loads(tmp_path: Path, arch: str, cache_kind: str) -> None:
    if torch_internals.torch_release() < (2, 12, 0):
        # torch 2.11 cannot save what reads a builtin from a decorator's module: each process
        # compiles in-process, right, and says so once
        for _ in range(2):
            report = _run(tmp_path, arch, cache_kind)
            assert report["loaded"] is False and len(report["warnings"]) == 1, report
            assert "cannot be compiled ahead of time" in report["warnings"][0]
            assert "Missing required external references" in report["warnings"][0]
        return
    assert _run(tmp_path, arch, cache_kind) == {"loaded": False, "warnings": []}
    assert _run(tmp_path, arch, cache_kind) == {"loaded": True, "warnings": []}


@slow(
    "each case is two processes compiling and loading a transformers model",
    "tests/test_compile_cache.py::test_a_decorated_method_is_saved_and_loaded",
)
@pytest.mark.parametrize(
    ("arch", "cache_kind"),
    [
        ("llama", "static"),
        ("llama", "none"),
        ("llama", "made"),
        ("llama", "dynamic"),
        ("qwen2_moe", "none"),
        ("qwen2_moe", "static"),
    ],
)
def test_transformers_forwards_are_saved_and_loaded(
    tmp_path: Path, arch: str, cache_kind: str
) -> None:
    _saves_and_loads(tmp_path, arch, cache_kind)
