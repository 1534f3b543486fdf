"""What a newcomer reads: every command's --help, and ``airstream run --torchair``'s report."""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from airstream.cli import build_parser, main
from airstream.runtime.trace import OpRecord

COMMANDS = ["demo", "explain", "selftest", "doctor", "run", "bench"]


def _help(command: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The text ``airstream COMMAND --help`` prints."""
    with pytest.raises(SystemExit) as stop:
        main([*command, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def _sections(text: str) -> dict[str, list[str]]:
    """--help text by section: "usage", "description", then each ``heading:`` block."""
    sections: dict[str, list[str]] = {"usage": []}
    current = "usage"
    for line in text.splitlines():
        heading = re.fullmatch(r"([a-z][a-z ]*):", line)
        if heading:
            current = heading.group(1)
            sections[current] = []
        elif not line and current == "usage":
            current = "description"
            sections[current] = []
        elif line:
            sections[current].append(line)
    return sections


def _choices(command: str, dest: str) -> list[str]:
    """The choices of the positional ``dest`` of subcommand ``command``."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if a.dest == dest)
    return list(action.choices or ())


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["top", *COMMANDS])
def test_help_says_what_it_does_with_examples_that_parse(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    sections = _sections(_help(command, capsys))
    description = " ".join(line.strip() for line in sections["description"])
    sentence = re.search(r"[A-Za-z`][^.]{20,}\.(\s|$)", description)
    assert sentence, f"no description sentence: {description!r}"
    examples = [line.strip() for line in sections.get("examples", [])]
    assert examples and all(e.startswith("airstream ") for e in examples), examples
    for example in examples:  # each example is a command line this parser accepts
        words = shlex.split(example, comments=True)[1:]
        words = words[: words.index(">")] if ">" in words else words  # the shell's redirection
        if command:
            assert words[0] == command[0], example
        assert build_parser().parse_args(words).command == words[0]


def test_selftest_help_describes_each_suite(capsys: pytest.CaptureFixture[str]) -> None:
    description = _sections(_help(["selftest"], capsys))["description"]
    described = {m.group(1) for line in description if (m := re.match(r"  (\w+)  +\S", line))}
    assert (
        set(_choices("selftest", "suite"))
        == described
        == {"fuzz", "microbatch", "opinfo", "models"}
    )


def test_bench_help_describes_each_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    description = _sections(_help(["bench"], capsys))["description"]
    described = {m.group(1) for line in description if (m := re.match(r"  ([\w-]+) +\w", line))}
    names = _choices("bench", "name")
    assert len(names) >= 12 and set(names) == described


def _op(stream: str | None, name: str, fused: tuple[str, ...] = (), call: int = 0) -> OpRecord:
    """An OpRecord as the runtimes write it (a segment when ``fused``)."""
    detail = f"{name}: cpp_fused_0 [fused {', '.join(fused)}]" if fused else ""
    return OpRecord(stream, name, 0, 1, call, "t", detail, fused)


def _report_lines(text: str) -> dict[str, tuple[list[str], str]]:
    """``stream X: a, b x2 (how)`` lines of a report -> {X: ([a, b x2], how)}."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s+stream (\S+): (.+) \((.+)\)", line)
        if match:
            found[match.group(1)] = (match.group(2).split(", "), match.group(3))
    return found


def _seen(*graphs: list[OpRecord], calls: int = 1) -> object:
    """A listener that heard ``graphs``, one call each unless ``calls`` says more."""
    from airstream.cli.run_report import WhereRan as _WhereRan

    seen = _WhereRan()
    for records in graphs:
        seen.graphs[tuple((r.stream or "", r.name) for r in records)] = records
    seen.calls = calls
    return seen


def test_report_names_ops_per_stream_without_bookkeeping() -> None:
    from airstream.cli.run_report import where_ran as _where_ran

    graph = [
        _op("stream_1", "segment_stream_1_0", ("mm", "abs_1")),
        _op("stream_1", "getitem_2"),
        _op(None, "segment_main_0", ("add", "sub")),
        _op(None, "getitem"),
        _op(None, "mul_3"),
    ]
    text = _where_ran(_seen(graph, calls=2))  # type: ignore[arg-type]
    assert text.splitlines()[0] == "airstream: what ran where (1 compiled graph, 2 calls):"
    lines = _report_lines(text)
    assert list(lines) == ["main", "stream_1"]
    assert lines["stream_1"] == (
        ["mm", "abs"],
        "2 ops, fused by max-autotune into 1 kernel segment",
    )
    assert lines["main"] == (
        ["add", "sub", "mul"],
        "3 ops: 2 fused by max-autotune into 1 kernel segment, 1 run one by one",
    )
    assert "getitem" not in text and "segment_" not in text
    assert "a kernel segment is a run of consecutive ops of one stream" in text


def test_report_without_segments_counts_repeats_and_graphs() -> None:
    from airstream.cli.run_report import where_ran as _where_ran

    forward = [_op(None, "t"), _op(None, "addmm"), _op("side", "t_1"), _op("side", "addmm_1")]
    backward = [_op(None, "mm"), _op(None, "mm_1"), _op(None, "getitem_4")]
    text = _where_ran(_seen(forward, backward, calls=20))  # type: ignore[arg-type]
    assert "(2 compiled graphs, the first 20 calls)" in text.splitlines()[0]
    assert [line.strip() for line in text.splitlines() if "graph " in line and " of " in line] == [
        "graph 1 of 2:",
        "graph 2 of 2:",
    ]
    assert re.search(r"^    stream main: mm x2 \(2 ops, run one by one\)$", text, re.M)
    assert re.search(r"^    stream side: t, addmm \(2 ops, run one by one\)$", text, re.M)
    assert "kernel segment" not in text


def test_report_stops_listening_after_its_calls() -> None:
    from airstream.cli.run_report import WhereRan as _WhereRan
    from airstream.runtime.trace import CallTrace, add_listener, tracing_wanted

    seen = _WhereRan(limit=2)
    add_listener(seen)
    for _ in range(2):
        trace = CallTrace()
        trace.ops.append(_op(None, "relu"))
        trace.finish()
    assert seen.calls == 2 and len(seen.graphs) == 1
    assert not tracing_wanted()


SCRIPT = """
import torch
import torch_npu  # noqa: F401
from torchair.scope import npu_stream_switch, npu_wait_tensor

import torchair


class Model(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x) + 1
        with npu_stream_switch("side", 0):
            z = torch.mm(npu_wait_tensor(x, y), x).abs()
        return y * 2, z


opt = torch.compile(Model(), backend=torchair.get_npu_backend())
x = torch.randn(8, 8).npu()
for _ in range(3):
    opt(x)
print("done")
"""


def test_run_torchair_says_what_ran_where(tmp_path: Path) -> None:
    script = tmp_path / "two_streams.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, "-m", "airstream.cli", "run", "--torchair", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.index("done") < out.index("airstream: what ran where (1 compiled graph, 3 calls):")
    lines = _report_lines(out)
    assert list(lines) == ["main", "side"]
    assert lines["side"][0] == ["mm", "abs"] and lines["main"][0] == ["relu", "add", "mul"]
    if "kernel segment" in lines["side"][1]:  # max-autotune compiled it (a C++ compiler is here)
        assert lines["side"][1] == "2 ops, fused by max-autotune into 1 kernel segment"
        assert "a kernel segment is a run of consecutive ops" in out
    assert "getitem" not in out and "ran on stream" not in out
