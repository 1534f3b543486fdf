"""CompilerConfig: defaults, validation on assignment, dotted paths, printing and equality."""

from __future__ import annotations

import pytest

import airstream
from airstream import CompilerConfig, ConfigError


def test_defaults_match_design() -> None:
    c = CompilerConfig()
    assert c.mode == "default"  # resolved per device: tests/test_mode.py
    assert c.post_grad_custom_pre_pass is None and c.post_grad_custom_post_pass is None
    assert c.debug.graph_dump.type is None
    assert c.debug.run_eagerly is False and c.debug.verify_passes is False
    assert c.experimental_config.remove_noop_ops is True
    assert c.experimental_config.keep_inference_input_mutations is True
    assert c.ge_config.enable_single_stream is False
    assert c.stream_config.threads_per_stream == 1


def test_config_error_is_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


def test_unknown_option_lists_valid_names_and_suggests() -> None:
    c = CompilerConfig()
    with pytest.raises(ConfigError, match=r"unknown option 'modee'.*Did you mean 'mode'.*debug"):
        c.modee = "x"
    with pytest.raises(ConfigError, match=r"unknown option 'debug.run_eager'.*run_eagerly"):
        c.debug.run_eager = True
    with pytest.raises(AttributeError, match="verify_passes"):
        _ = c.debug.nonexistent


@pytest.mark.parametrize(
    ("path", "value", "allowed"),
    [
        ("mode", "fast", "'default', 'reduce-overhead', 'max-autotune'"),
        ("debug.graph_dump.type", "png", "None, 'txt', 'py', 'dot', 'svg'"),
        ("debug.run_eagerly", 1, "True, False"),
        ("ge_config.enable_single_stream", "yes", "True, False"),
        ("stream_config.threads_per_stream", 0, "an int >= 1"),
        ("stream_config.threads_per_stream", True, "an int >= 1"),
    ],
)
def test_bad_value_names_option_and_allowed_values(path: str, value: object, allowed: str) -> None:
    c = CompilerConfig()
    with pytest.raises(ConfigError) as info:
        c.set_option(path, value)
    message = str(info.value)
    assert repr(path) in message and allowed in message and repr(value) in message
    assert c == CompilerConfig(), "a rejected value must leave the config unchanged"


def test_pass_slots_take_callable_or_list_and_reject_others() -> None:
    def p1(gm, inputs, config):
        pass

    def p2(gm, inputs, config):
        pass

    c = CompilerConfig()
    c.post_grad_custom_pre_pass = p1
    assert c.post_grad_custom_pre_pass is p1
    c.post_grad_custom_post_pass = [p1, p2]
    assert c.post_grad_custom_post_pass == (p1, p2)
    with pytest.raises(TypeError, match="post_grad_custom_pre_pass must be a callable"):
        c.post_grad_custom_pre_pass = "my_pass"
    with pytest.raises(TypeError, match=r"post_grad_custom_post_pass\[1\] must be a callable"):
        c.post_grad_custom_post_pass = [p1, 3]


def test_groups_cannot_be_replaced() -> None:
    c = CompilerConfig()
    with pytest.raises(ConfigError, match="'debug' is an option group.*run_eagerly"):
        c.debug = {}


def test_dotted_paths_roundtrip() -> None:
    c = CompilerConfig()
    c.set_option("debug.graph_dump.type", "txt")
    assert c.debug.graph_dump.type == "txt" and c.get_option("debug.graph_dump.type") == "txt"
    with pytest.raises(ConfigError, match="unknown option 'debug.graph_dump.kind'"):
        c.set_option("debug.graph_dump.kind", "txt")
    with pytest.raises(ConfigError, match="unknown option 'nope.x'"):
        c.get_option("nope.x")
    assert "stream_config.threads_per_stream" in CompilerConfig.option_paths()
    d = CompilerConfig.from_options({"debug.run_eagerly": True, "mode": "max-autotune"})
    assert d.debug.run_eagerly is True and d.mode == "max-autotune"
    assert CompilerConfig.from_options(d.as_dict()) == d


def test_prints_readably_and_compares_by_value() -> None:
    a, b = CompilerConfig(), CompilerConfig()
    assert a == b
    b.debug.run_eagerly = True
    assert a != b
    text = repr(b)
    assert "CompilerConfig(mode='default'" in text and "run_eagerly=True" in text
    assert b.copy() == b and b.copy() is not b
    copy = b.copy()
    copy.debug.run_eagerly = False
    assert b.debug.run_eagerly is True, "copies are independent"


def test_get_backend_rejects_non_config() -> None:
    with pytest.raises(TypeError, match="airstream.CompilerConfig"):
        airstream.get_backend(compiler_config={"debug.run_eagerly": True})


def test_option_table_builds_nested_and_open_groups() -> None:
    from airstream.options.checks import boolean
    from airstream.options.schema import Option, OptionGroup

    class Table(OptionGroup, table={"a.b": Option(False, boolean), "a.c.*": Option(0)}):
        _NOUN = "table option"

    t = Table()
    assert Table.option_paths() == ["a.b"]
    t.a.b = True
    t.set_option("a.c.anything", 5)
    assert t.a.c.anything == 5 and t.a.c.unset == 0, "an unset name reads the default"
    assert t.as_dict() == {"a.b": True, "a.c.anything": 5}
    with pytest.raises(ConfigError, match=r"invalid value 1 for table option 'a.b'; allowed"):
        t.a.b = 1
    with pytest.raises(ConfigError, match=r"unknown table option 'a.x'.*Valid names.*b, c"):
        t.a.x = 1
    with pytest.raises(TypeError, match="both option and group"):

        class Clash(OptionGroup, table={"a": Option(), "a.b": Option()}):
            pass

    with pytest.raises(TypeError, match=r"\['as_dict'\] shadow attributes"):

        class Shadow(OptionGroup, table={"as_dict": Option()}):
            pass
