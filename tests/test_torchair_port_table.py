"""docs/torchair-tests.md is generated from the ports in tests/torchair: it must be current."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> Any:
    spec = importlib.util.spec_from_file_location(
        "port_table", ROOT / "tools" / "torchair_port_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("port_table", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_table_is_generated_from_the_current_ports() -> None:
    tool = _tool()
    assert tool.main(["--check"]) == 0, "run: python tools/torchair_port_table.py"


def test_every_port_names_a_real_torchair_test_and_every_test_has_a_disposition() -> None:
    tool = _tool()
    ports = tool.find_ports()
    assert len(ports) >= 150
    text = tool.build()  # raises on a mark that names no TorchAir test
    assert "| **total** | 686 |" in text
    reasons = tool.read_reasons()
    assert not set(ports) & set(reasons), "a test is both ported and listed as not ported"
