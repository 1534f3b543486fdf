"""Building and loading the CPU runtime's small C and C++ extensions (``handoff.c``,
``thread_state.cpp``): compiled once into airstream's cache directory with the compiler Python
was built with, then loaded as a module."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shlex
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["build", "load"]


def build(source: Path, target: Path, compiler: str, flags: list[str], libs: list[str]) -> None:
    """Compile ``source`` to the shared library ``target`` (atomically: another process may build
    it too). ``compiler``: Python's config variable naming it (``CC``, ``CXX``); ``flags`` before
    the source, ``libs`` after the output."""
    command = shlex.split(
        sysconfig.get_config_var(compiler) or ("cc" if compiler == "CC" else "c++")
    )
    include = sysconfig.get_paths()["include"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        copy = Path(tmp) / f"{target.name.split('.')[0]}{source.suffix}"
        copy.write_text(source.read_text())
        built = Path(tmp) / target.name
        command += [*flags, "-shared", "-fPIC", f"-I{include}", str(copy)]
        done = subprocess.run(
            [*command, "-o", str(built), *libs],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            raise OSError(f"{' '.join(command)} failed: {done.stderr.strip()[:500]}")
        built.replace(target)


def load(name: str, target: Path) -> Any:
    """The extension module ``name`` from the shared library ``target``."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(target))
    spec = importlib.util.spec_from_file_location(name, target, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
