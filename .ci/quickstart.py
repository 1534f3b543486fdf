"""What .ci/run needs from the repository, read without importing anything it installs.

    python .ci/quickstart.py commands   the README's quick-start lines, one per line
    python .ci/quickstart.py vllm       the README's "Serving with vLLM" lines, one per line
    python .ci/quickstart.py versions   the torch versions CI tests (TESTED_TORCH), floor first

Each is the fenced block right after its marker in README.md (``<!-- ci:quick-start -->``,
``<!-- ci:vllm -->``); CI runs its lines word for word, so the README cannot drift from what CI
proves.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- ci:quick-start"
VLLM_MARKER = "<!-- ci:vllm"


def quick_start(marker: str = MARKER) -> list[str]:
    """The command lines of the README's block after ``marker`` (blank lines dropped)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(marker)]
    if len(starts) != 1:
        raise SystemExit(f"README.md must have exactly one {marker} -->, found {len(starts)}")
    fence = starts[0] + 1
    if not lines[fence].startswith("```"):
        raise SystemExit(f"README.md:{fence + 1}: a ``` block must follow {marker} -->")
    block = []
    for line in lines[fence + 1 :]:
        if line.startswith("```"):
            return [b for b in block if b.strip()]
        block.append(line)
    raise SystemExit("README.md: the quick-start block is not closed")


def tested_versions() -> list[str]:
    """``TESTED_TORCH`` from src/airstream/torch_internals/registry.py."""
    tree = ast.parse((ROOT / "src" / "airstream" / "torch_internals" / "registry.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "TESTED_TORCH" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise SystemExit("TESTED_TORCH not found in src/airstream/torch_internals/registry.py")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "commands":
        print("\n".join(quick_start()))
    elif what == "vllm":
        print("\n".join(quick_start(VLLM_MARKER)))
    elif what == "versions":
        print("\n".join(sorted(tested_versions(), key=lambda v: tuple(map(int, v.split("."))))))
    else:
        raise SystemExit(__doc__)
