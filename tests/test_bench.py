"""``airstream bench overhead``: the report's shape (figures are printed, never asserted)."""

from __future__ import annotations

import pytest

from airstream.bench.overhead import format_overhead, run_overhead


def test_overhead_report_structure() -> None:
    report = run_overhead(ops=20, rounds=2, calls=3)
    assert report["ops"] == 20
    runners = set(report["results"])
    assert runners == {
        "fx.GraphModule",
        "fx.Interpreter",
        "airstream executor",
        "airstream torch.compile",
        "aot_eager torch.compile",
    }
    assert report["results"]["fx.GraphModule"]["ratio_vs_graphmodule"] == pytest.approx(1.0)
    assert all(r["us_per_call"] > 0 for r in report["results"].values())
    assert "vs GraphModule" in format_overhead(report)
