"""``tools/gpu-check``: a verdict to trust. A missing test tool fails the run (a dry run too),
an externally managed Python skips the install, an environment problem is never "all passed",
the steps' limits fit the budget with the main evidence first, and the CUDA tests' outcomes come
from their JUnit XML, per test. (CI runs the whole dry run; nothing here needs a GPU.)"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def _gpu_check() -> ModuleType:
    path = ROOT / "tools" / "gpu-check"
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(path))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _say(document: object) -> list[str]:
    """A command printing ``document`` as JSON."""
    return [PY, "-c", f"import json; print(json.dumps({document!r}))"]


PREFLIGHT_OK = ("preflight", _say({"problems": {}}), 30)


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_missing_pytest_fails_the_dry_run_and_names_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    check = _gpu_check()
    monkeypatch.setattr(check.environment, "importable", lambda name: name != "pytest")
    steps = [
        PREFLIGHT_OK,
        ("test-tools", [], 10),
        ("cuda-tests", [PY, "-c", "raise SystemExit('must not run')"], 30),
        ("environment", _say({"ran": True}), 30),
    ]
    monkeypatch.setattr(check.steps, "planned", lambda dry, out: steps)
    assert check.main(["--dry-run", str(tmp_path)]) == 3
    report = _report(tmp_path)
    assert report["verdict"] == "FAILED-ENVIRONMENT"
    assert list(report)[:3] == ["verdict", "failures", "environment_problems"]
    _, tools, tests, environment = report["steps"]
    assert tools["status"] == "failed" and tools["missing"] == ["pytest"]
    assert tools["reason"].startswith("pytest cannot be imported") and "--wheels" in tools["reason"]
    assert tests["status"] == "failed" and "pytest cannot be imported" in tests["reason"]
    assert environment["status"] == "passed"
    assert any("pytest" in problem for problem in report["environment_problems"])
    out = capsys.readouterr().out
    assert "FAILED-ENVIRONMENT" in out and "all passed" not in out
    assert "environment: test-tools: failed: pytest cannot be imported" in out


def test_the_missing_test_tools_install_from_wheels_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _gpu_check()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name = "gpu_check_probe_tool"
    info = f"{name}-1.0.dist-info"
    files = {
        f"{name}/__init__.py": "VERSION = '1.0'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheels / f"{name}-1.0-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    monkeypatch.setattr(check.steps, "TEST_TOOLS", (name,))
    monkeypatch.setattr(sys, "path", list(sys.path))
    step = check.environment.test_tools(str(wheels), tmp_path, 60)
    assert step["status"] == "passed", step
    assert step["versions"] == {name: "1.0"}
    assert (tmp_path / "site" / name / "__init__.py").is_file()
    assert str(tmp_path / "site") in check.processes.env(tmp_path)["PYTHONPATH"].split(":")


def test_a_step_needing_a_missing_optional_package_is_skipped_and_excused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    check = _gpu_check()
    monkeypatch.setattr(check.steps, "REQUIRES", {"bench-decode": ("no_such_package_here",)})
    steps = [PREFLIGHT_OK, ("bench-decode", _say({}), 30), ("environment", _say({"ran": 1}), 30)]
    monkeypatch.setattr(check.steps, "planned", lambda dry, out: steps)
    assert check.main(["--dry-run", str(tmp_path)]) == 0
    report = _report(tmp_path)
    assert report["machine"]["missing"] == {"bench-decode": ["no_such_package_here"]}
    _, skipped, ran = report["steps"]
    assert skipped["status"] == "skipped" and skipped["excused"]
    assert skipped["reason"] == "needs no_such_package_here, not installed here"
    assert ran["status"] == "passed" and ran["result"] == {"ran": 1}
    assert report["verdict"] == "all passed" and len(report["excused"]) == 1
    out = capsys.readouterr().out
    assert "excused: bench-decode: skipped: needs no_such_package_here" in out


def test_an_environment_problem_skips_what_needs_it_and_is_never_all_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _gpu_check()
    monkeypatch.setattr(check.steps, "REQUIRES", {})
    preflight = _say({"problems": {"Triton": "import triton failed"}, "gpus": ["H100"]})
    steps = [("preflight", preflight, 30), ("install", _say({}), 30), ("trace", _say({}), 30)]
    monkeypatch.setattr(check.steps, "planned", lambda dry, out: steps)
    monkeypatch.setattr(check.environment, "externally_managed", lambda: None)
    assert check.main([str(tmp_path)]) == 3  # not a dry run: the problem is fatal
    report = _report(tmp_path)
    assert report["verdict"] == "FAILED-ENVIRONMENT" and report["failures"] == []
    assert report["steps"][2]["status"] == "skipped"
    assert report["steps"][2]["reason"] == "environment lacks Triton"
    assert "Triton: import triton failed" in report["environment_problems"]
    # no GPU at all: exit 2, and the report says why
    steps[0] = ("preflight", _say({"problems": {"CUDA": "no device"}}), 30)
    assert check.main([str(tmp_path)]) == 2
    assert _report(tmp_path)["verdict"] == "FAILED-ENVIRONMENT"


def test_an_externally_managed_python_skips_the_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _gpu_check()
    monkeypatch.setattr(check.steps, "REQUIRES", {})
    monkeypatch.setattr(check.environment, "build_problem", lambda: None)
    refuse = "import sys; sys.stderr.write('error: externally-managed-environment\\n'); exit(1)"
    steps = [PREFLIGHT_OK, ("install", [PY, "-c", refuse], 30)]
    monkeypatch.setattr(check.steps, "planned", lambda dry, out: steps)
    # found beforehand: the marker file outside a venv
    marker = tmp_path / "EXTERNALLY-MANAGED"
    monkeypatch.setattr(check.environment, "externally_managed", lambda: marker)
    assert check.main(["--dry-run", str(tmp_path / "a")]) == 0
    install = _report(tmp_path / "a")["steps"][1]
    assert install["status"] == "skipped" and "PEP 668" in install["reason"]
    assert str(marker) in install["reason"] and "log" not in install  # pip did not run
    # or from pip's refusal
    monkeypatch.setattr(check.environment, "externally_managed", lambda: None)
    assert check.main(["--dry-run", str(tmp_path / "b")]) == 0
    report = _report(tmp_path / "b")
    install = report["steps"][1]
    assert install["status"] == "skipped" and "PEP 668" in install["reason"]
    assert "pip refused" in install["reason"] and report["verdict"] == "all passed"
    # a venv is never externally managed
    assert sys.prefix == sys.base_prefix or check.environment.externally_managed() is None


def test_the_limits_fit_the_budget_and_the_help_lists_them(tmp_path: Path) -> None:
    check = _gpu_check()
    steps = check.steps.planned(False, tmp_path)
    limits = {name: limit for name, _, limit in steps}
    assert limits == check.steps.LIMITS
    assert sum(limits.values()) <= check.steps.BUDGET_S <= 400
    dry = {name: limit for name, _, limit in check.steps.planned(True, tmp_path)}
    assert dry == {name: limit * check.steps.DRY_SCALE for name, limit in limits.items()}
    for name, limit in limits.items():
        assert f"``{name}`` ({limit} s)" in check.__doc__, name
    assert f"add up to {sum(limits.values())} s" in " ".join(check.__doc__.split())
    assert f"budget of {check.steps.BUDGET_S} s" in " ".join(check.__doc__.split())


def test_the_main_evidence_runs_first_and_the_benchmarks_last(tmp_path: Path) -> None:
    check = _gpu_check()
    names = [name for name, _, _ in check.steps.planned(False, tmp_path)]
    assert names[:4] == ["preflight", "install", "test-tools", "environment"]
    assert names[4:7] == ["trace", "cuda-tests", "cuda-sanitizer"]
    benches = [i for i, name in enumerate(names) if name.startswith("bench-")]
    assert benches == list(range(len(names) - len(benches), len(names)))
    assert names.index("baseline") < benches[0] and names.index("weights-by-address") < benches[0]


SAMPLE_JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="1" failures="1" skipped="1" tests="5">
<testcase classname="tests.test_x" name="test_ok" time="0.5"/>
<testcase classname="tests.test_x" name="test_bad[a]" time="1.0">
  <failure message="AssertionError: streams raced&#10;assert 1 == 2">long traceback</failure>
</testcase>
<testcase classname="tests.test_x" name="test_gpu" time="0"><skipped type="pytest.skip"
  message="needs a CUDA GPU">tests/test_x.py:9: needs a CUDA GPU</skipped></testcase>
<testcase classname="tests.test_x.TestGroup" name="test_fixture" time="0.1">
  <error message="failed on setup with &quot;RuntimeError: CUDA error&quot;">trace</error>
</testcase>
<testcase classname="tests.test_x" name="test_race" time="0.2">
  <failure message="torch.cuda._sanitizer.CUDASanitizerErrors: detected 1 errors">tb</failure>
  <system-err>noise
CSAN detected a possible data race on tensor with data pointer 1234
Access by stream 7 during kernel:
aten::add</system-err>
</testcase>
</testsuite></testsuites>
"""


def test_the_junit_report_gives_each_tests_outcome_and_message(tmp_path: Path) -> None:
    check = _gpu_check()
    (tmp_path / "x.xml").write_text(SAMPLE_JUNIT)
    tests = check.processes.parse_junit(tmp_path / "x.xml", "tests/test_x.py")
    assert [(t["test"], t["outcome"]) for t in tests] == [
        ("tests/test_x.py::test_ok", "passed"),
        ("tests/test_x.py::test_bad[a]", "failed"),
        ("tests/test_x.py::test_gpu", "skipped"),
        ("tests/test_x.py::TestGroup::test_fixture", "error"),
        ("tests/test_x.py::test_race", "failed"),
    ]
    assert "message" not in tests[0] and tests[0]["seconds"] == 0.5
    assert tests[1]["message"] == "AssertionError: streams raced\nassert 1 == 2"
    assert tests[2]["message"] == "needs a CUDA GPU"
    assert tests[3]["message"] == 'failed on setup with "RuntimeError: CUDA error"'
    race = tests[4]["message"].splitlines()
    assert race[0].endswith("detected 1 errors")
    assert race[1:] == [
        "CSAN detected a possible data race on tensor with data pointer 1234",
        "Access by stream 7 during kernel:",
        "aten::add",
    ]


def _fake_pytest(junit: str, rc: int) -> list[str]:
    """A command that writes ``junit`` where pytest's --junitxml says, and exits ``rc``."""
    script = f"""
        import sys
        path = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml="))
        open(path, "w").write({junit!r})
        sys.exit({rc})
    """
    return [PY, "-c", textwrap.dedent(script)]


def test_each_cuda_test_file_runs_alone_and_its_tests_are_reported(tmp_path: Path) -> None:
    check = _gpu_check()
    files = ["tests/test_a.py", "tests/test_b.py"]
    step = check.processes.run_tests(
        "cuda-tests", _fake_pytest(SAMPLE_JUNIT, 1), files, 60, tmp_path, False
    )
    assert step["status"] == "failed"
    assert [f["status"] for f in step["files"]] == ["failed", "failed"]
    assert step["counts"] == {"passed": 2, "failed": 4, "skipped": 2, "error": 2}
    assert (tmp_path / "cuda-tests-test_a.xml").is_file()
    assert (tmp_path / "cuda-tests-test_b.log").is_file()
    # on a GPU: a skip for want of a GPU fails, and so does a file that collected no test
    only_skip = SAMPLE_JUNIT.split('<testcase classname="tests.test_x" name="test_ok"')[0]
    only_skip += '<testcase classname="t" name="t"><skipped message="needs a CUDA GPU"/>'
    only_skip += "</testcase></testsuite></testsuites>"
    step = check.processes.run_tests(
        "cuda-tests", _fake_pytest(only_skip, 0), files[:1], 60, tmp_path, False
    )
    assert step["status"] == "failed" and "for want of a GPU" in step["reason"]
    step = check.processes.run_tests(
        "cuda-tests", _fake_pytest(only_skip, 0), files[:1], 60, tmp_path, True
    )
    assert step["status"] == "passed"  # a dry run: the tests skip, as they should
    empty = "<testsuites><testsuite/></testsuites>"
    step = check.processes.run_tests(
        "cuda-tests", _fake_pytest(empty, 5), files[:1], 60, tmp_path, False
    )
    assert step["status"] == "failed" and "collected no cuda test" in step["reason"]
    # the sanitizer's limit spent before the stream files: a failure; after them: listed
    step = check.processes.run_tests(
        "cuda-sanitizer", _say({}), check.steps.STREAM_TEST_FILES, 3, tmp_path, False
    )
    assert step["status"] == "failed" and "not reached" in step["reason"]
    assert step["files_not_run"] == list(check.steps.STREAM_TEST_FILES)


@pytest.mark.usefixtures("sigint_raises")  # what the steps' processes get
def test_a_test_file_at_its_limit_is_interrupted_and_its_finished_tests_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _gpu_check()
    monkeypatch.setattr(check.steps, "GRACE_S", 1)
    monkeypatch.setattr(check.steps, "MIN_FILE_S", 1)
    one = '<testsuites><testsuite><testcase classname="tests.test_a" name="test_done"/>'
    one += "<testcase/></testsuite></testsuites>"  # pytest's entry for the interrupted test
    script = f"""
        import sys, time
        path = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml="))
        try:
            time.sleep(30)
        finally:  # pytest writes its report when SIGINT interrupts it
            open(path, "w").write({one!r})
    """
    command = [PY, "-c", textwrap.dedent(script)]
    limit = 2.5  # SIGINT after 1.5 s, killed 1 s later
    step = check.processes.run_tests(
        "cuda-tests", command, ["tests/test_a.py"], limit, tmp_path, False
    )
    (record,) = step["files"]
    assert record["status"] == "timed out" and record["seconds"] < limit
    assert "1 test(s) reported before" in record["reason"]
    assert step["tests"] == [
        {"test": "tests/test_a.py::test_done", "outcome": "passed", "seconds": 0}
    ]


def test_the_cuda_test_files_put_the_stream_and_nccl_files_first(tmp_path: Path) -> None:
    check = _gpu_check()
    marked = "import pytest\n\n\n@pytest.mark." + "cuda\ndef test_x() -> None:\n    pass\n"
    (tmp_path / "tests" / "deep").mkdir(parents=True)
    for name in ("test_a.py", "test_cuda_runtime.py", "test_cuda_nccl.py", "deep/test_z.py"):
        (tmp_path / "tests" / name).write_text(marked)
    commented = "# pytest.mark." + "cuda is not a mark\n"
    (tmp_path / "tests" / "test_plain.py").write_text(commented)
    assert check.steps.cuda_test_files(tmp_path) == [
        "tests/test_cuda_runtime.py",
        "tests/test_cuda_nccl.py",
        "tests/deep/test_z.py",
        "tests/test_a.py",
    ]
    assert check.steps.cuda_test_files()[:2] == list(check.steps.STREAM_TEST_FILES)


def test_a_dry_run_runs_the_steps_after_the_first_three_side_by_side_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    check = _gpu_check()
    timed = "import json, time; "
    timed += "s = time.time(); time.sleep(0.5); print(json.dumps({'at': [s, time.time()]}))"
    steps = [(name, [PY, "-c", timed], 30) for name in ("environment", "a", "b")]
    monkeypatch.setattr(check.steps, "REQUIRES", {})
    monkeypatch.setattr(check.steps, "planned", lambda dry, out: [PREFLIGHT_OK, *steps])
    monkeypatch.setattr(check.run.os, "cpu_count", lambda: 3)
    assert check.main(["--dry-run", str(tmp_path)]) == 0
    report = _report(tmp_path)["steps"]
    assert [s["step"] for s in report] == ["preflight", "environment", "a", "b"]
    spans = [s["result"]["at"] for s in report[1:]]
    assert max(start for start, _ in spans) < min(end for _, end in spans), "side by side"


def test_the_sanitizer_plugin_lets_torch_compile_run_compiled_code_under_the_mode() -> None:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gpu_check_csan
    finally:
        sys.path.remove(str(ROOT / "tools"))
    TorchDispatchMode = gpu_check_csan.dispatch_mode_base()

    seen: list[str] = []

    class Logging(TorchDispatchMode):  # stands in for the sanitizer's mode
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    class Sanitizer:  # torch.cuda._sanitizer.CUDASanitizer's interface
        def __init__(self) -> None:
            self.dispatch, self.enabled = Logging(), False

        def enable(self) -> None:
            self.dispatch.__enter__()
            self.enabled = True

        def disable(self) -> None:
            self.dispatch.__exit__(None, None, None)
            self.enabled = False

    compiled: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        compiled.append(1)
        return gm.forward

    sanitizer = Sanitizer()
    assert "off" in gpu_check_csan.sanitize_compiled_code(sanitizer, TorchDispatchMode)
    sanitizer.enable()
    try:
        x = torch.ones(3)
        torch.compile(lambda x: x.sin() * 2, backend=backend)(x)
        assert compiled == [], "under a dispatch mode torch.compile runs eager"
        note = gpu_check_csan.sanitize_compiled_code(sanitizer, TorchDispatchMode)
        assert sanitizer.enabled and "compiled code under it" in note
        seen.clear()
        torch.compile(lambda x: x.cos() * 3, backend=backend)(x)
        assert compiled == [1], "now it compiles"
        assert seen == ["aten.cos.default", "aten.mul.Tensor"], "and the mode sees the call"
    finally:
        sanitizer.disable()
        torch.compiler.reset()


def test_the_install_step_is_offline_and_keeps_what_is_installed() -> None:
    check = _gpu_check()
    command = next(
        command for name, command, _ in check.steps.planned(True, ROOT) if name == "install"
    )
    for flag in ("--no-deps", "--no-build-isolation", "--no-index"):
        assert flag in command
    problem = check.environment.build_problem()
    if problem is not None:  # the step is skipped, saying why (Python's own setuptools 65)
        assert problem.startswith("setuptools ") and "builds an editable install only" in problem
        return
    # pip resolves the same command without reaching any index (what the GPU machine allows)
    done = subprocess.run(
        [*command[:-2], "--dry-run", "-e", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PIP_NO_INDEX": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
