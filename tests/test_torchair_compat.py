"""The TorchAir-compatible surface and ``airstream run --torchair``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from tests.conftest import assert_same, compile_model, graph_of

import airstream
import airstream.compat.torchair as torchair
from airstream.compat.torchair import config as compat_config

ROOT = Path(__file__).resolve().parents[1]

_PROFILE_RUN = """
import json, runpy, sys
from airstream.compat.torchair import install
install(verbose=False)
import airstream
with airstream.profile() as prof:
    runpy.run_path(sys.argv[1], run_name="__main__")
# a max-autotune segment stands for the nodes it fused
print("JSON" + json.dumps([[n, e.stream] for e in prof.events for n in (e.fused or [e.name])]))
"""


def _run_example(name: str) -> tuple[str, list[list[str | None]]]:
    result = subprocess.run(
        [sys.executable, "-c", _PROFILE_RUN, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("JSON"))
    return result.stdout, json.loads(line[4:])


def test_guide_example_runs_with_streams_from_the_profile() -> None:
    out, events = _run_example("torchair_guide.py")
    assert "result equals eager: True" in out
    streams = {name: stream for name, stream in events}
    assert streams["mm"] == "stream_1" and streams["abs_1"] == "stream_1"
    assert streams["add"] is None and streams["sub"] is None


def test_moe_shared_example_overlaps_the_shared_expert() -> None:
    out, events = _run_example("torchair_moe_shared.py")
    assert "result equals eager: True" in out
    shared = [name for name, stream in events if stream == "shared_expert"]
    assert any(name.startswith("addmm") for name in shared) and len(shared) >= 4


def test_runner_cli_prints_the_device_and_the_result(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "airstream.cli",
            "run",
            "--torchair",
            str(ROOT / "examples" / "torchair_guide.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "running TorchAir code on" in result.stdout
    assert "result equals eager: True" in result.stdout


def _run_torchair(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``airstream run --torchair script`` in a fresh process, in the script's folder."""
    return subprocess.run(
        [sys.executable, "-m", "airstream.cli", "run", "--torchair", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=script.parent,
    )


def test_real_torch_npu_leaves_imports_alone(tmp_path: Path) -> None:
    fake = tmp_path / "torch_npu"
    fake.mkdir()
    (fake / "__init__.py").write_text("MARK = 'the real one'\n")
    script = tmp_path / "script.py"
    script.write_text("import torch_npu\nprint('torch_npu is', torch_npu.MARK)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = _run_torchair(script, env)
    assert result.returncode == 0, result.stderr
    assert "a real torch_npu is importable" in result.stdout
    assert "torch_npu is the real one" in result.stdout


class _SwitchAndWait(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = x.sum(-1, keepdim=True)
        with torchair.scope.npu_stream_switch("side", 1):
            side = torchair.scope.npu_wait_tensor(x, gate).exp()
        return gate + side


def test_stream_switch_and_wait_tensor_order_in_the_plan() -> None:
    compiled, backend = compile_model(_SwitchAndWait(), fullgraph=True)
    x = torch.randn(4, 8)
    with torch.no_grad():
        assert_same(compiled(x), _SwitchAndWait()(x))
    graph = graph_of(backend, "inference")
    assert graph.streams.priorities == {"side": 1}
    reasons = {(s.producer.name, s.reason) for s in graph.plan.syncs}
    assert ("sum_1", "control") in reasons, reasons
    side = graph.plan.stream("side").steps
    assert str(side[0]).startswith("wait"), "the side stream waits for the gate first"


def test_ops_wait_rejects_bad_lists_in_torchairs_words() -> None:
    with pytest.raises(ValueError, match=r"^torchair.ops.wait\(\) requires at least one tensor"):
        torchair.ops.wait([])
    with pytest.raises(ValueError, match="non-empty list of tensors"):
        torchair.ops.wait(None)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"^arguments of torchair.ops.wait\(\) must be torch.Tensor: element 0 is int",
    ):
        torchair.ops.wait([3])
    token = torchair.ops.record()
    torchair.ops.wait([token])
    t = torch.ones(2)
    assert torch.equal(torchair.ops.npu_wait_tensor(t, token), t)


def test_scope_helpers_are_attributes_without_effect() -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        with torchair.scope.super_kernel("sk"), torchair.scope.limit_core_num(4, 8):
            y = x.sin()
        with torchair.scope.op_never_timeout():
            return y.cos()

    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), x.sin().cos())
    graph = graph_of(backend, "inference")
    assert graph.streams.side_streams == ()
    sin = next(n for n in graph.graph_module.graph.nodes if n.name == "sin")
    assert sin.meta["air_scope"]["_super_kernel_scope"] == "sk"


def test_scope_arguments_as_torchair_checks_them() -> None:
    """super_kernel(None) is an empty scope; op_never_timeout takes a bool only, checked when
    the scope is made, in TorchAir's words; npu_stream_switch records enable_inner_parallel."""

    def model(x: torch.Tensor) -> torch.Tensor:
        with torchair.scope.super_kernel("sk"):
            with torchair.scope.super_kernel(None):  # type: ignore[arg-type]
                y = x.sin()
            with torchair.scope.op_never_timeout(False):
                y = y.cos()
            with torchair.scope.npu_stream_switch("side", 2, enable_inner_parallel=False):
                y = y.exp()
        return y

    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), x.sin().cos().exp())
    nodes = {n.name: n for n in graph_of(backend, "inference").graph_module.graph.nodes}
    assert nodes["sin"].meta["air_scope"]["_super_kernel_scope"] == ""
    assert nodes["cos"].meta["air_scope"]["_op_exec_never_timeout"] == "False"
    assert nodes["exp"].meta["air_scope"]["_enable_inner_parallel"] == "False"
    for bad, name in ((1, "int"), ("False", "str")):
        with pytest.raises(
            TypeError,
            match=rf"^op_never_timeout\(\) argument 'enable' must be bool, but got {name}\.$",
        ):
            torchair.scope.op_never_timeout(bad)  # type: ignore[arg-type]


# ---- CompilerConfig: every option accepted, warned or rejected ------------------------------

EFFECTIVE = {
    "mode": ("reduce-overhead", "mode"),
    "debug.run_eagerly": (True, "debug.run_eagerly"),
    "debug.graph_dump.type": ("py", "debug.graph_dump.type"),
    "debug.graph_dump.path": ("dumps", "debug.graph_dump.path"),
    "experimental_config.keep_inference_input_mutations": (
        False,
        "experimental_config.keep_inference_input_mutations",
    ),
    "experimental_config.remove_noop_ops": (False, "experimental_config.remove_noop_ops"),
    "experimental_config.enable_view_optimize": (False, "experimental_config.enable_view_optimize"),
    "ge_config.enable_single_stream": (True, "ge_config.enable_single_stream"),
}
NO_EFFECT = {
    "debug.fx_summary": {"type": "csv"},
    "debug.data_dump": {"type": "npy"},
    "experimental_config.cc_parallel_enable": True,
    "experimental_config.memory_efficiency": True,
    "experimental_config.frozen_parameter": True,
    "experimental_config.static_model_ops_lower_limit": 4,
    "experimental_config.jit_compile": "auto",
    "experimental_config.npu_fx_pass": True,
    "experimental_config.tiling_schedule_optimize": True,
    "experimental_config.topology_sorting_strategy": "BFS",
    "ge_config.export_compile_stat": "2",
    "ge_config.optimization_switch": "x",
    "export.experimental": True,
    "aoe_config.aoe_mode": "2",
    "fusion_config.fusion_switch_file": "f.json",
    "dump_config.enable_dump": True,
    "inference_config.dynamic_gears_merge_policy": "zip",
}
REJECTED = {
    "mode": "fast",
    "debug.run_eagerly": "yes",
    "debug.graph_dump.type": "svg",
    "experimental_config.jit_compile": "always",
    "experimental_config.topology_sorting_strategy": "random",
    "ge_config.export_compile_stat": "9",
}


def _set(config: torchair.CompilerConfig, path: str, value: object) -> None:
    *groups, leaf = path.split(".")
    node = config
    for g in groups:
        node = getattr(node, g)
    setattr(node, leaf, value)


@pytest.mark.parametrize("path", sorted(EFFECTIVE))
def test_effective_options_reach_airstream(path: str) -> None:
    value, target = EFFECTIVE[path]
    config = torchair.CompilerConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for options that work
        _set(config, path, value)
    assert config.airstream.get_option(target) == value


@pytest.mark.parametrize("path", sorted(NO_EFFECT))
def test_npu_only_options_warn_once(path: str) -> None:
    compat_config._warned.discard(path)
    config = torchair.CompilerConfig()
    with pytest.warns(UserWarning, match=f"option '{path}' has no effect off the NPU"):
        _set(config, path, NO_EFFECT[path])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _set(torchair.CompilerConfig(), path, NO_EFFECT[path])  # once per option


@pytest.mark.parametrize("path", sorted(REJECTED))
def test_invalid_values_are_rejected_like_torchair(path: str) -> None:
    with pytest.raises(ValueError, match="optional values"):
        _set(torchair.CompilerConfig(), path, REJECTED[path])


def test_pbtxt_dumps_as_txt_and_backend_factories() -> None:
    config = torchair.CompilerConfig()
    config.debug.graph_dump.type = "pbtxt"
    assert config.airstream.debug.graph_dump.type == "txt"
    with pytest.raises(ValueError, match="unknown TorchAir option 'debug.nope'"):
        config.debug.nope = 1
    backend = torchair.get_npu_backend(
        compiler_config=torchair.CompilerConfig(), custom_decompositions={}
    )
    assert backend.config == torchair.CompilerConfig().airstream
    assert callable(torchair.get_compiler())
    with pytest.raises(TypeError, match="torchair CompilerConfig"):
        torchair.get_npu_backend(compiler_config=object())  # type: ignore[arg-type]


def test_torchair_default_mode_is_airstreams_max_autotune() -> None:
    from airstream.compat import torchair

    config = torchair.CompilerConfig()
    assert config.mode == "max-autotune"
    assert config.airstream.mode == "max-autotune"
    config.mode = "reduce-overhead"
    assert config.airstream.mode == "reduce-overhead"


# ---- the TorchAir table over airstream's option machinery -----------------------------------


def test_mapped_option_writes_its_airstream_path_and_reads_back() -> None:
    config = torchair.CompilerConfig()
    config.debug.run_eagerly = True
    assert config.airstream.get_option("debug.run_eagerly") is True
    assert config.debug.run_eagerly is True and config.get_option("debug.run_eagerly") is True
    config.set_option("debug.run_eagerly", False)
    assert config.airstream.debug.run_eagerly is False and config.debug.run_eagerly is False
    config.debug.graph_dump.type = "pbtxt"  # converted on the way: read back as given
    assert config.debug.graph_dump.type == "pbtxt"
    assert config.airstream.debug.graph_dump.type == "txt"


def test_every_mapped_target_is_an_airstream_option() -> None:
    targets = compat_config._targets()
    assert targets["debug.run_eagerly"] == "debug.run_eagerly"
    assert set(targets.values()) <= set(airstream.CompilerConfig.option_paths())
    assert set(targets) <= set(torchair.CompilerConfig.option_paths())


def test_npu_only_values_are_stored_and_leave_airstream_alone() -> None:
    config = torchair.CompilerConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config.experimental_config.frozen_parameter = True
        config.export.experimental = True
    assert config.experimental_config.frozen_parameter is True
    assert config.export.experimental is True and config.export.unset_name is None
    assert config.as_dict()["export.experimental"] is True
    assert config.airstream == torchair.CompilerConfig().airstream


def test_rejected_torchair_value_changes_neither_config() -> None:
    config = torchair.CompilerConfig()
    with pytest.raises(airstream.ConfigError, match=r"'debug.graph_dump.type'.*'pbtxt'"):
        config.debug.graph_dump.type = "svg"  # airstream takes svg; TorchAir does not
    with pytest.raises(ValueError, match="optional values: None or an int >= -1"):
        config.experimental_config.static_model_ops_lower_limit = -2
    assert config == torchair.CompilerConfig()
    assert config.airstream == torchair.CompilerConfig().airstream


def test_the_torchair_logger(caplog: pytest.LogCaptureFixture) -> None:
    """TorchAir's tests lower its logger to DEBUG and read it with assertLogs or root capture."""
    import logging

    from airstream.compat.torchair.core.utils import logger

    assert torchair.logger is logger and logger.name == "torchair"
    assert logging.getLogger("torchair") is logger  # assertLogs("torchair") finds it
    assert logger.propagate and logger.level in (logging.ERROR, logging.DEBUG)
    level = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        with caplog.at_level(logging.DEBUG):
            logger.debug("a debug line")
            logger.event("an event")
            logger.warning_once("said once")
            logger.warning_once("said once")
    finally:
        logger.setLevel(level)
    records = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "torchair"]
    assert records == [
        ("DEBUG", "a debug line"),
        ("EVENT", "an event"),
        ("WARNING", "said once"),
    ]


@pytest.mark.parametrize(("debug", "level"), [("", "ERROR"), ("1", "DEBUG")])
def test_the_torchair_logger_under_run_torchair(tmp_path: Path, debug: str, level: str) -> None:
    """``import torchair`` / ``from torchair.core.utils import logger`` in an unmodified script;
    TORCH_COMPILE_DEBUG=1 at import makes it DEBUG, as in TorchAir."""
    script = tmp_path / "script.py"
    script.write_text(
        "import logging\n"
        "import torchair\n"
        "from torchair.core.utils import logger\n"
        "assert torchair.logger is logger\n"
        "print('level', logging.getLevelName(logger.level))\n"
        "logger.error('an error line')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_DEBUG"}
    if debug:  # torch itself fails at import on TORCH_COMPILE_DEBUG="" (int(""))
        env["TORCH_COMPILE_DEBUG"] = debug
    result = _run_torchair(script, env)
    assert result.returncode == 0, result.stderr
    assert f"level {level}" in result.stdout
    assert "[ERROR] TORCHAIR(" in result.stdout and "an error line" in result.stdout
