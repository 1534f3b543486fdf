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
from tests.conftest import assert_same, compile_model, count, graph_of, slow

import airstream
import airstream.compat.torchair as torchair
from airstream.compat.torchair import config as compat_config
from airstream.compat.torchair import values as compat_values

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


@slow(
    "a fresh process profiling the guide example",
    "tests/test_help.py::test_run_torchair_says_what_ran_where",
)
def test_guide_example_runs_with_streams_from_the_profile() -> None:
    out, events = _run_example("torchair_guide.py")
    assert "result equals eager: True" in out
    streams = {name: stream for name, stream in events}
    assert streams["mm"] == "stream_1" and streams["abs_1"] == "stream_1"
    assert streams["add"] is None and streams["sub"] is None


@slow(
    "a fresh process profiling a max-autotune MoE example",
    "tests/test_help.py::test_run_torchair_says_what_ran_where",
)
def test_moe_shared_example_overlaps_the_shared_expert() -> None:
    out, events = _run_example("torchair_moe_shared.py")
    assert "result equals eager: True" in out
    shared = [name for name, stream in events if stream == "shared_expert"]
    assert any(name.startswith("addmm") for name in shared) and len(shared) >= 4


@slow(
    "a fresh process running the guide example under airstream run",
    "tests/test_help.py::test_run_torchair_says_what_ran_where",
)
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
    "mode": ("reduce-overhead", "mode", "reduce-overhead"),
    "debug.run_eagerly": (True, "debug.run_eagerly", True),
    "debug.graph_dump.type": ("py", "debug.graph_dump.type", "py"),
    "debug.graph_dump.path": ("dumps", "debug.graph_dump.path", os.path.realpath("dumps")),
    "experimental_config.keep_inference_input_mutations": (
        False,
        "experimental_config.keep_inference_input_mutations",
        False,
    ),
    "experimental_config.remove_noop_ops": (False, "experimental_config.remove_noop_ops", False),
    "experimental_config.enable_view_optimize": (
        False,
        "experimental_config.enable_view_optimize",
        False,
    ),
    "ge_config.enable_single_stream": (True, "ge_config.enable_single_stream", True),
    "debug.data_dump.type": ("npy", "debug.data_dump.type", "npy"),
}
NO_EFFECT = {
    "debug.fx_summary.type": "csv",
    "debug.aclgraph.clone_input": False,
    "debug.aclgraph.static_capture_size_limit": 8,
    "debug.deadlock_check": True,
    "experimental_config.cc_parallel_enable": True,
    "experimental_config.frozen_parameter": True,
    "experimental_config.static_model_ops_lower_limit": 4,
    "experimental_config.jit_compile": "auto",
    "experimental_config.topology_sorting_strategy": "BFS",
    "experimental_config.enable_ref_data": True,
    "experimental_config.aclgraph._aclnn_static_shape_kernel_sym_value_range": [1, 2],
    "ge_config.oo_level": "O1",
    "ge_config.aicore_num": "24|48",
    "export.experimental.enable_lite_export": True,
    "aoe_config.aoe_mode": "2",
    "fusion_config.fusion_switch_file": __file__,
    "dump_config.enable_dump": True,
    "dump_config.dump_step": "0|1|2-5",
    "inference_config.dynamic_gears_merge_policy": "product",
    "aclgraph_config.use_custom_pool": object(),
}
REJECTED = {  # path: (value, exception type, TorchAir's words)
    "mode": ("fast", ValueError, "not in optional list ['max-autotune', 'reduce-overhead'"),
    "debug.run_eagerly": ("yes", ValueError, "Value 'yes' (type: <class 'str'>) not in optional"),
    "debug.graph_dump.type": ("svg", ValueError, "not in optional list ['txt', 'pbtxt', 'py']"),
    "experimental_config.topology_sorting_strategy": ("random", ValueError, "optional list"),
    "ge_config.export_compile_stat": (2, ValueError, "(type: <class 'int'>) not in optional"),
    "debug.aclgraph.static_capture_size_limit": (0, ValueError, "Please set value in [1, "),
    "experimental_config.static_model_ops_lower_limit": ("-1", ValueError, "integer type"),
    "dump_config.dump_path": ("./*****", FileNotFoundError, "Please set legal dir path, ./****"),
    "dump_config.dump_config_path": ("./x", FileNotFoundError, "is not '.json' file!"),
    "dump_config.dump_step": ("a-b", ValueError, "correct example:0|1|2-5|6"),
    "aoe_config.aoe_config_file": ("./x", FileNotFoundError, "legal file path, ./x is not found"),
    "experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir": (
        3,
        TypeError,
        "value must be str or None, got <class 'int'>",
    ),
    "post_grad_custom_pre_pass": ("p", TypeError, "value must be Callable or None"),
}


def _set(config: torchair.CompilerConfig, path: str, value: object) -> None:
    *groups, leaf = path.split(".")
    node = config
    for g in groups:
        node = getattr(node, g)
    setattr(node, leaf, value)


def _get(config: torchair.CompilerConfig, path: str) -> object:
    node: object = config
    for name in path.split("."):
        node = getattr(node, name)
    return node


@pytest.mark.parametrize("path", sorted(EFFECTIVE))
def test_effective_options_reach_airstream(path: str) -> None:
    value, target, expected = EFFECTIVE[path]
    config = torchair.CompilerConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning for options that work
        _set(config, path, value)
    assert config.airstream.get_option(target) == expected


@pytest.mark.parametrize("path", sorted(NO_EFFECT))
def test_npu_only_options_warn_once_and_read_back(path: str) -> None:
    compat_config._warned.discard(path)
    config = torchair.CompilerConfig()
    with pytest.warns(UserWarning, match=f"option '{path}' has no effect off the NPU"):
        _set(config, path, NO_EFFECT[path])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _set(torchair.CompilerConfig(), path, NO_EFFECT[path])  # once per option
    stored = _get(config, path)
    raw = stored.raw if isinstance(stored, compat_values.Value) else stored
    assert raw is NO_EFFECT[path] or raw == NO_EFFECT[path]
    assert config.airstream == torchair.CompilerConfig().airstream


@pytest.mark.parametrize("path", sorted(REJECTED))
def test_invalid_values_are_rejected_in_torchairs_words(path: str) -> None:
    value, kind, words = REJECTED[path]
    config = torchair.CompilerConfig()
    with pytest.raises(kind) as info:
        _set(config, path, value)
    assert words in str(info.value)
    assert config == torchair.CompilerConfig()


def test_values_read_back_as_torchair_reads_them() -> None:
    config = torchair.CompilerConfig()
    assert config.mode.value == "max-autotune" and config.mode.default == "max-autotune"
    assert config.debug.run_eagerly.value == "0" and not config.debug.run_eagerly
    config.debug.run_eagerly = True
    assert config.debug.run_eagerly.value == "1" and config.debug.run_eagerly
    config.experimental_config.static_model_ops_lower_limit = 0
    assert config.experimental_config.static_model_ops_lower_limit.value == "0"
    assert config.ge_config.oo_constant_folding.value is None
    config.debug.graph_dump.type = "py"
    assert config.debug.graph_dump.enabled and config.debug.graph_dump.path is None
    name = config.debug.graph_dump.full_path("dynamo_original_graph_1")
    assert name is not None and name.startswith("./dynamo_original_graph_1_rank_0_pid_")
    assert name.endswith(".py") and "_ts_" in name


def test_every_torchair_option_path_exists_and_unknown_names_are_explained() -> None:
    config = torchair.CompilerConfig()
    paths = [path for path, _ in config.leaves()]
    assert len(paths) == 72 and len(set(paths)) == 72
    for path in (
        "debug.aclgraph.clone_input",
        "ge_config.oo_dead_code_elimination",
        "export.experimental.auto_atc_config_generated",
        "aclgraph_config.use_custom_pool",
        "experimental_config.aot_config_output_loss_index",
    ):
        assert path in paths, path
    with pytest.raises(ValueError, match=r"^_Debug has no option nope, all options \["):
        config.debug.nope = 1
    with pytest.raises(ValueError, match="Did you mean 'debug.run_eagerly'"):
        config.debug.run_eagrly = True
    with pytest.raises(ValueError, match="is a group"):
        config.debug.graph_dump = "py"


def test_mapped_targets_are_airstream_options() -> None:
    targets = {rule.target for rule in compat_config._AIRSTREAM.values()}
    assert targets <= set(airstream.CompilerConfig.option_paths())
    torchair_paths = {path for path, _ in torchair.CompilerConfig().leaves()}
    assert set(compat_config._AIRSTREAM) <= torchair_paths


def test_modes_and_backend_factories() -> None:
    config = torchair.CompilerConfig()
    assert config.airstream.mode == "max-autotune"  # TorchAir's default
    config.mode = "reduce-overhead"
    assert config.airstream.mode == "reduce-overhead"
    config.mode = "npugraph_ex"  # graph capture and replay: airstream's reduce-overhead
    assert config.airstream.mode == "reduce-overhead" and config.mode.value == "npugraph_ex"
    config.debug.graph_dump.type = "pbtxt"
    assert config.airstream.debug.graph_dump.type == "txt"
    backend = torchair.get_npu_backend(
        compiler_config=torchair.CompilerConfig(), custom_decompositions={}
    )
    assert backend.config == torchair.CompilerConfig().airstream
    assert callable(torchair.get_compiler())
    with pytest.raises(TypeError, match="torchair CompilerConfig"):
        torchair.get_npu_backend(compiler_config=object())  # type: ignore[arg-type]


def test_custom_pass_receives_the_torchair_config() -> None:
    seen: list[object] = []

    def read_mode(gm: torch.fx.GraphModule, example_inputs: object, config: object) -> None:
        seen.append(config.mode.value)  # type: ignore[attr-defined]

    config = torchair.CompilerConfig()
    config.mode = "reduce-overhead"
    config.post_grad_custom_pre_pass = read_mode
    config.post_grad_custom_post_pass = read_mode
    opt = torch.compile(torch.sin, backend=torchair.get_npu_backend(compiler_config=config))
    x = torch.randn(4)
    assert_same(opt(x), torch.sin(x))
    assert seen == ["reduce-overhead", "reduce-overhead"]
    assert config.post_grad_custom_pre_pass.value is read_mode


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


@pytest.mark.parametrize(
    ("debug", "level"),
    [
        pytest.param(
            "", "ERROR", marks=slow("a fresh process", "tests/torchair/test_ta_log.py::test_basic")
        ),
        pytest.param(
            "1", "DEBUG", marks=slow("a fresh process", "tests/torchair/test_ta_log.py::test_basic")
        ),
    ],
)
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


# ---- tagged events, npu_print, options= --------------------------------------------------------


def test_tagged_events_pair_into_an_edge_and_unknown_events_are_refused() -> None:
    event = torchair.ops.npu_create_tagged_event("compat_edge")
    with pytest.raises(ValueError, match="^tagged event tag compat_edge is already in use"):
        torchair.ops.npu_create_tagged_event("compat_edge")
    with pytest.raises(ValueError, match="^tagged event .* is not in use"):
        torchair.ops.npu_tagged_event_record(object())

    def model(x: torch.Tensor) -> torch.Tensor:
        with torchair.scope.npu_stream_switch("side"):
            y = x.exp()
            torchair.ops.npu_tagged_event_record(event)
        z = x.sin()  # main runs this before it waits
        torchair.ops.npu_tagged_event_wait(event)
        torchair.ops.npu_record_tagged_stream(y, "side")
        return y + z

    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.randn(8)
    assert_same(compiled(x), model(x))
    graph = graph_of(backend, "inference")
    gm = graph.graph_module
    assert count(gm, torch.ops.air.tagged_event_wait.default) == 0, "paired: lowered to a wait"
    assert count(gm, torch.ops.air.record_tagged_stream.default) == 0
    assert count(gm, torch.ops.air.tagged_event_record.default) == 1, "the record still runs"
    syncs = {(s.producer.name, s.reason) for s in graph.plan.syncs}
    assert ("exp", "control") in syncs, syncs  # main waits for the side stream's work so far
    assert graph.streams.stream_of["tagged_event_record"] == "side"


def test_an_unpaired_tagged_wait_runs_as_a_step() -> None:
    event = torchair.ops.npu_create_tagged_event("compat_unpaired")
    torchair.ops.npu_tagged_event_record(event)  # recorded in eager code, before the graph

    def model(x: torch.Tensor) -> torch.Tensor:
        torchair.ops.npu_tagged_event_wait(event)
        return x * 3

    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.randn(4)
    assert_same(compiled(x), x * 3)
    gm = graph_of(backend, "inference").graph_module
    assert count(gm, torch.ops.air.tagged_event_wait.default) == 1


def test_npu_print_stays_in_the_graph_in_program_order(capsys: pytest.CaptureFixture[str]) -> None:
    def model(x: torch.Tensor) -> torch.Tensor:
        torchair.ops.npu_print("x =", x, summarize_size=2)
        y = x * 2
        torchair.ops.npu_print("y =", y, tensor_detail=True)
        return y

    compiled, backend = compile_model(model, fullgraph=True)
    x = torch.arange(6.0)
    assert_same(compiled(x), x * 2)
    assert capsys.readouterr().out.splitlines() == [
        "x = [0 1 ... 4 5]",
        "y = tensor([0 2 4 6 8 10], shape=[6], dtype=torch.float32)",  # 6 <= 2 * 3: all
    ]
    assert count(graph_of(backend, "inference").graph_module, torch.ops.air.print.default) == 2
    with pytest.raises(ValueError, match="requires at least one tensor input"):
        torchair.ops.npu_print("no tensor")
    with pytest.raises(TypeError, match="summarize_size must be int, got str"):
        torchair.ops.npu_print(x, summarize_size="3")  # type: ignore[arg-type]


def test_torchair_options_in_torch_compile() -> None:
    backend = torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())
    compiled = torch.compile(torch.cos, backend=backend, options={"force_eager": True})
    x = torch.randn(3)
    assert_same(compiled(x), torch.cos(x))
    assert type(backend.graphs[-1].executor).__name__ == "SerialExecutor"
    torch.compiler.reset()
    bad = torch.compile(torch.cos, backend=backend, options={"nope": True})
    with pytest.raises(Exception, match="Invalid option 'nope', allowed options"):
        bad(x)


@pytest.mark.parametrize(
    "warm",
    [
        True,
        pytest.param(
            False,
            marks=slow(
                "as in TorchAir's docs, the first call compiles under the profiler with stacks "
                "(about 30 s)",
                "tests/test_torchair_compat.py::"
                "test_doc_style_script_with_backend_npu_and_the_npu_profiler",
            ),
        ),
    ],
    ids=["compiled-before-profiling", "as-in-the-docs"],
)
def test_doc_style_script_with_backend_npu_and_the_npu_profiler(tmp_path: Path, warm: bool) -> None:
    script = tmp_path / "script.py"
    script.write_text(
        "import torch, torch_npu, torchair\n"
        "opt = torch.compile(lambda x: x.exp(), backend='npu')\n"
        "x = torch.randn(3).npu()\n"
        + ("opt(x)\n" if warm else "")
        + "with torch_npu.profiler.profile(\n"
        "        activities=[torch_npu.profiler.ProfilerActivity.NPU,\n"
        "                    torch_npu.profiler.ProfilerActivity.CPU],\n"
        "        with_stack=True,\n"
        "        experimental_config=torch_npu.profiler._ExperimentalConfig(\n"
        "            profiler_level=torch_npu.profiler.ProfilerLevel.Level2),\n"
        "        schedule=torch_npu.profiler.schedule(wait=0, warmup=0, active=1, repeat=1),\n"
        "        on_trace_ready=torch_npu.profiler.tensorboard_trace_handler('./prof')) as prof:\n"
        "    y = opt(x)\n"
        "prof.step()\n"
        "torchair.patch_for_hcom()\n"
        "print('same', bool(torch.allclose(y, x.exp())))\n"
    )
    result = _run_torchair(script, dict(os.environ))
    assert result.returncode == 0, result.stderr
    assert "same True" in result.stdout
    assert list((tmp_path / "prof").glob("*.json")), "the trace was written"
