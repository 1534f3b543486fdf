"""Running a step's command: in the checkout, in its own process group, at most its time limit
(SIGINT, then killed), its output logged; a test step's files one process each, every test's
outcome read from pytest's JUnit XML."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from gpu_check import steps


def last_json(text: str) -> Any:
    """The JSON document a command printed last (its report), or None."""
    start = text.find("{")
    while start != -1:
        try:
            return json.loads(text[start:])
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
    return None


def first_lines(text: str | None, count: int = 6) -> str:
    lines = [line.rstrip() for line in (text or "").strip().splitlines() if line.strip()]
    return "\n".join(lines[:count] + (["..."] if len(lines) > count else []))


def parse_junit(path: Path, test_file: str) -> list[dict[str, Any]]:
    """Every test case in a pytest JUnit XML report: its id (``file::name``), outcome (passed,
    failed, error or skipped), seconds and, unless it passed, the first lines of its message
    (with a CUDA sanitizer's race report, where its stderr has one)."""
    module = test_file.removesuffix(".py").replace("/", ".")
    tests = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        if not name:  # the test running when pytest was interrupted
            continue
        inner = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
        test = "::".join(part for part in (test_file, inner, name) if part)
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                text = found.get("message") or ""
                if not text and found.text:  # no message: the traceback's last lines
                    text = "\n".join(found.text.strip().splitlines()[-4:])
                message = first_lines(text)
                break
        stderr = case.findtext("system-err") or ""
        race = stderr.find("CSAN detected")
        if race != -1:
            message = (message + "\n" if message else "") + first_lines(stderr[race:], 8)
        entry = {"test": test, "outcome": outcome, "seconds": float(case.get("time") or 0)}
        if message:
            entry["message"] = message
        tests.append(entry)
    return tests


def env(out: Path, extra_paths: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    # the tests import tests.conftest; ./src serves where airstream is not installed; OUT/site
    # holds the test tools --wheels installed
    site = out / "site"
    path = [
        str(steps.ROOT),
        str(steps.ROOT / "src"),
        *([str(site)] if site.is_dir() else []),
        *extra_paths,
    ]
    path.append(os.environ.get("PYTHONPATH", ""))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), **extra)


def execute(
    command: list[str], limit: float, log: Path, env: dict[str, str]
) -> tuple[int | None, str, str, float]:
    """Run ``command`` in the checkout for at most ``limit`` seconds; write ``log``; return its
    exit status (None: timed out), stdout, stderr and seconds. At its limit it gets SIGINT and
    steps.GRACE_S seconds of the limit to finish (pytest then writes its JUnit report of the tests
    done), then it and the processes it started are killed."""
    begin = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=steps.ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: what it started goes with it
    )
    rc: int | None
    try:
        stdout, stderr = process.communicate(timeout=max(1.0, limit - steps.GRACE_S))
        rc = process.returncode
    except BaseException as error:
        if not isinstance(error, subprocess.TimeoutExpired):  # Ctrl-C: take the step along
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            raise
        rc = None
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=steps.GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        with contextlib.suppress(ProcessLookupError):  # what it left running
            os.killpg(process.pid, signal.SIGKILL)
    seconds = time.monotonic() - begin
    log.write_text(f"$ {' '.join(command)}\n\n{stdout}\n--- stderr ---\n{stderr}")
    return rc, stdout, stderr, seconds


def run_step(name: str, command: list[str], limit: int, out: Path) -> dict[str, Any]:
    log = out / f"{name}.log"
    rc, stdout, stderr, seconds = execute(command, limit, log, env(out))
    status = "passed" if rc == 0 else ("timed out" if rc is None else "failed")
    step: dict[str, Any] = {"step": name, "status": status}
    if rc is None:
        step["reason"] = f"still running after its limit ({limit} s)"
    elif rc != 0:
        tail = [line for line in stderr.splitlines() if line.strip()]
        step["reason"] = f"exit {rc}" + (f": {tail[-1].strip()}" if tail else "")
    result = last_json(stdout)
    if name in steps.PLAIN_OUTPUT:
        tail = [line for line in stdout.splitlines() if line.strip()]
        result = {"last_line": tail[-1] if tail else ""}
    elif rc == 0 and result is None:
        step.update(status="failed", reason="printed no JSON report")
    step.update(
        seconds=round(seconds, 1), limit=limit, command=command, log=log.name, result=result
    )
    if name == "install" and rc not in (0, None) and "externally-managed-environment" in stderr:
        step.update(status="skipped", reason=PEP668 + " (pip refused: see install.log)")
        step["excused"] = True
    return step


PEP668 = "this Python is externally managed (PEP 668); the steps run airstream from src/"


def run_tests(
    name: str, command: list[str], files: list[str], limit: float, out: Path, dry: bool
) -> dict[str, Any]:
    """The cuda-marked tests of each file in its own process, within ``limit`` seconds in all;
    every test's outcome from the file's JUnit XML."""
    sanitizer = name == "cuda-sanitizer"
    note = out / f"{name}-mode.txt"
    extra = {"TORCH_CUDA_SANITIZER": "1", "GPU_CHECK_CSAN_NOTE": str(note)} if sanitizer else {}
    environ = env(out, (str(steps.ROOT / "tools"),) if sanitizer else (), **extra)
    begin = time.monotonic()
    results: list[dict[str, Any]] = []
    tests: list[dict[str, Any]] = []
    for test_file in files:
        stem = Path(test_file).stem
        record: dict[str, Any] = {"file": test_file}
        results.append(record)
        left = limit - (time.monotonic() - begin)
        if left < steps.MIN_FILE_S:
            record.update(status="not run", reason=f"the step's limit ({limit:.0f} s) was spent")
            continue
        xml = out / f"{name}-{stem}.xml"
        xml.unlink(missing_ok=True)
        log = out / f"{name}-{stem}.log"
        run = [*command, f"--junitxml={xml}", test_file]
        rc, stdout, _, seconds = execute(run, left, log, environ)
        found = parse_junit(xml, test_file) if xml.is_file() else []
        tests += found
        counts: dict[str, int] = {}
        for test in found:
            counts[test["outcome"]] = counts.get(test["outcome"], 0) + 1
        record.update(seconds=round(seconds, 1), exit=rc, counts=counts, log=log.name)
        if xml.is_file():
            record["junit"] = xml.name
        no_gpu = [
            t for t in found if t["outcome"] == "skipped" and "CUDA GPU" in t.get("message", "")
        ]
        if rc is None:
            why = f"still running after {left:.0f} s; {len(found)} test(s) reported before"
            record.update(status="timed out", reason=why)
        elif rc == 5 or (rc == 0 and not found):
            record.update(status="failed", reason="collected no cuda test")
        elif rc not in (0, 1) or not xml.is_file():
            tail = [line for line in stdout.splitlines() if line.strip()]
            why = f"pytest exit {rc}" + (f": {tail[-1].strip()}" if tail else "")
            record.update(status="failed", reason=why)
        elif rc == 1 or counts.get("failed") or counts.get("error"):
            bad = counts.get("failed", 0) + counts.get("error", 0)
            record.update(status="failed", reason=f"{bad} test(s) failed")
        elif no_gpu and not dry:
            why = f"{len(no_gpu)} test(s) skipped for want of a GPU on a GPU machine"
            record.update(status="failed", reason=why)
        else:
            record["status"] = "passed"
    failed = [r for r in results if r["status"] not in ("passed", "not run")]
    not_run = [r["file"] for r in results if r["status"] == "not run"]
    step: dict[str, Any] = {"step": name, "status": "failed" if failed else "passed"}
    problems = [f"{r['file']}: {r['status']} ({r.get('reason', '')})" for r in failed]
    if sanitizer:
        unreached = [f for f in not_run if f in steps.STREAM_TEST_FILES]
        problems += [f"{f}: not reached within the limit" for f in unreached]
        if unreached:
            step["status"] = "failed"
    elif not_run:
        problems += [f"{f}: not run, the limit was spent" for f in not_run]
        step["status"] = "failed"
    if problems:
        step["reason"] = "; ".join(problems)
    outcomes = {}
    for test in tests:
        outcomes[test["outcome"]] = outcomes.get(test["outcome"], 0) + 1
    step.update(
        seconds=round(time.monotonic() - begin, 1),
        limit=round(limit),
        command=[*command, "--junitxml=OUT/<step>-<file>.xml", "<file>"],
        files=results,
        counts=outcomes,
        tests=tests,
    )
    if sanitizer:
        step["files_not_run"] = not_run
        step["sanitizer"] = note.read_text().strip() if note.is_file() else "(no note)"
        step["races"] = [t for t in tests if "CSAN detected" in t.get("message", "")]
    return step
