#!/usr/bin/env python3
"""Build docs/torchair-tests.md: for each TorchAir test file, how many of its tests are ported
to tests/torchair and pass here, and why each of the others is not.

Inputs: docs/torchair-tests.csv (every upstream test, with a keyword triage category),
the ``@upstream("file::test")`` marks in tests/torchair/test_*.py (a port marked ``xfail``
counts as ported but failing), and tests/torchair/not_ported.csv (file,test,reason) for tests
read and left out. A test in none of them gets its triage category's reason.

    python tools/torchair_port_table.py           # rewrite the table
    python tools/torchair_port_table.py --check   # exit 1 when the table is out of date
"""

from __future__ import annotations

import argparse
import ast
import csv
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "docs" / "torchair-tests.csv"
PORTS = ROOT / "tests" / "torchair"
REASONS = PORTS / "not_ported.csv"
TABLE = ROOT / "docs" / "torchair-tests.md"

# Reason kinds: the first word of a reason, before ":".
NPU_ONLY = {"GE", "GE_DUMP", "HCCL", "NPU"}
SMOKE = (
    "NPU: a smoke test written for a real Ascend device (torch_npu kernels such as "
    "npu_add_rms_norm, numerics compared on the device)"
)
BY_CATEGORY = {  # the triage's reason for a test nobody has read yet
    "GE": "GE: builds or inspects the Ascend graph engine's graph (ops, attrs, converters, IR)",
    "GE_DUMP": "GE_DUMP: the graph engine's data-dump options and files",
    "HCCL": "HCCL: Ascend collectives and process groups in the graph engine",
    "CACHE": "CACHE: TorchAir's on-disk cache_compile format (its generated code and files)",
    "PY": "not ported yet: Python surface only",
    "ACLGRAPH_PY": "not ported yet: Python surface with stubbed NPU graphs",
}


@dataclass
class Port:
    function: str
    module: str
    failing: bool  # marked xfail: a known gap


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target)


def _string(node: ast.expr, names: dict[str, str]) -> str:
    """A mark's argument: a literal, a module-level str constant, or a ``+`` of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _string(node.left, names) + _string(node.right, names)
    raise SystemExit(f"@upstream argument is not a string constant: {ast.unparse(node)}")


def find_ports() -> dict[tuple[str, str], Port]:
    """``{(upstream file, upstream test): Port}`` from the ``@upstream`` marks."""
    ports: dict[tuple[str, str], Port] = {}
    for path in sorted(PORTS.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        names: dict[str, str] = {}
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    try:
                        names[target.id] = _string(stmt.value, names)
                    except SystemExit:
                        pass
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            marks: list[str] = []
            failing = False
            for dec in fn.decorator_list:
                name = _decorator_name(dec)
                if name.endswith("upstream") and isinstance(dec, ast.Call):
                    marks += [_string(a, names) for a in dec.args]
                if name.endswith("xfail"):
                    failing = True
            for full in marks:
                file, _, test = full.partition("::")
                ports[(file, test.rsplit("::", 1)[-1])] = Port(fn.name, path.name, failing)
    return ports


def read_reasons() -> dict[tuple[str, str], str]:
    if not REASONS.exists():
        return {}
    with REASONS.open() as f:
        return {(r["file"], r["test"]): r["reason"] for r in csv.DictReader(f)}


def kind_of(reason: str) -> str:
    return reason.split(":", 1)[0].strip()


def build() -> str:
    with UPSTREAM.open() as f:
        upstream = list(csv.DictReader(f))
    ports, reasons = find_ports(), read_reasons()
    known = {(r["file"], r["test"]) for r in upstream}
    unknown = sorted(set(ports) - known)
    if unknown:
        raise SystemExit(f"@upstream names that are not TorchAir tests: {unknown}")
    per_file: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    left_out: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for row in upstream:
        key = (row["file"], row["test"])
        counts = per_file[row["file"]]
        counts["tests"] += 1
        port = ports.get(key)
        if port is not None:
            counts["ported"] += 1
            counts["pass" if not port.failing else "fail"] += 1
            continue
        reason = reasons.get(key) or (
            SMOKE if row["upstream_runs_on"].startswith("NPU") else BY_CATEGORY[row["category"]]
        )
        kind = kind_of(reason)
        counts["npu" if kind in NPU_ONLY else "other"] += 1
        left_out[row["file"]].append((row["test"], reason))
    total: dict[str, int] = defaultdict(int)
    for counts in per_file.values():
        for k, v in counts.items():
            total[k] += v
    lines = [
        "# TorchAir's tests, ported",
        "",
        "Generated by `python tools/torchair_port_table.py` from `docs/torchair-tests.csv` (every",
        "test in TorchAir's repository), the `@upstream(...)` marks in `tests/torchair/` and",
        "`tests/torchair/not_ported.csv`. Do not edit by hand.",
        "",
        f"- Ported: **{total['ported']}** tests; **{total['pass']}** pass here, "
        f"{total['fail']} are known gaps (marked xfail, reason in the test).",
        f"- Not ported, NPU-only (graph engine, its dumps, HCCL): {total['npu']}.",
        f"- Not ported for another reason (listed below): {total['other']}.",
        "",
        "| TorchAir file | tests | ported | pass here | not ported: NPU-only | not ported: other |",
        "|---|---|---|---|---|---|",
    ]
    for file in sorted(per_file):
        c = per_file[file]
        lines.append(
            f"| {file} | {c['tests']} | {c['ported']} | {c['pass']} | {c['npu']} | {c['other']} |"
        )
    lines.append(
        f"| **total** | {total['tests']} | {total['ported']} | {total['pass']} | "
        f"{total['npu']} | {total['other']} |"
    )
    lines += ["", "## Tests not ported, with the reason", ""]
    for file in sorted(left_out):
        lines += [f"### {file}", ""]
        by_reason: dict[str, list[str]] = defaultdict(list)
        for test, reason in left_out[file]:
            by_reason[reason].append(test)
        for reason in sorted(by_reason):
            tests = ", ".join(f"`{t}`" for t in sorted(by_reason[reason]))
            lines.append(f"- {reason} ({len(by_reason[reason])}): {tests}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the table is stale")
    args = parser.parse_args(argv)
    text = build()
    if args.check:
        if not TABLE.exists() or TABLE.read_text() != text:
            print(f"{TABLE} is out of date: run python tools/torchair_port_table.py")
            return 1
        return 0
    TABLE.write_text(text)
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
