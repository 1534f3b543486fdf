#!/usr/bin/env python3
"""Run the Python examples of TorchAir's documentation, verbatim, under
``airstream run --torchair`` and report which ran.

TorchAir's docs are not part of this repository; point the tool at a checkout of
Ascend/torchair (or at its ``docs`` folder)::

    python tools/torchair_doc_examples.py ~/src/torchair/docs/zh/ascend_ir [--json out.json]

Every fenced Python block that imports torch and torchair (or torch_npu: npugraph_ex's pages)
is written to a file and run in
a fresh process in a scratch folder, with a time limit. A block fails when the process exits
non-zero; the last line of its stderr says why. A block indented inside a list item is
dedented. A block that stops on a ``NameError`` uses a name the page defines in prose or in
another block (``model``, ``npu_backend``): it is counted as a fragment, not as a failure.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.S)


def examples(root: Path) -> list[tuple[str, int, str]]:
    """``(markdown file, block number, code)`` for each runnable-looking block under ``root``."""
    found = []
    for md in sorted(root.rglob("*.md")):
        text = md.read_text(errors="replace")
        for i, match in enumerate(BLOCK.finditer(text)):
            code = textwrap.dedent(match.group(1))
            if "import torch" in code and ("torchair" in code or "torch_npu" in code):
                found.append((str(md.relative_to(root)), i, code))
    return found


def run_one(code: str, timeout: float) -> tuple[bool, str, float]:
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "example.py"
        script.write_text(code)
        start = time.perf_counter()
        try:
            result = subprocess.run(
                [sys.executable, "-m", "airstream.cli", "run", "--torchair", str(script)],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=scratch,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False, f"timed out after {timeout:.0f} s", time.perf_counter() - start
        seconds = time.perf_counter() - start
        lines = [x for x in result.stderr.strip().splitlines() if x.strip()]
        why = lines[-1] if lines else ""
        return result.returncode == 0, why, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("docs", type=Path, help="a folder of TorchAir's markdown docs")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per example")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--only", default="", help="regex: run the files whose path matches")
    args = parser.parse_args(argv)
    results = []
    for md, index, code in examples(args.docs):
        if not re.search(args.only, md):
            continue
        ok, why, seconds = run_one(code, args.timeout)
        status = "ok" if ok else "fragment" if why.startswith("NameError") else "FAIL"
        results.append({"file": md, "block": index, "status": status, "why": why, "s": seconds})
        print(f"{status:8} {md}#{index} ({seconds:.1f} s) {'' if ok else why}")
    counts = {k: sum(r["status"] == k for r in results) for k in ("ok", "fragment", "FAIL")}
    print(
        f"{counts['ok']} of {len(results)} examples ran; {counts['fragment']} fragments "
        f"(need names from elsewhere on the page); {counts['FAIL']} failed"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if counts["FAIL"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
