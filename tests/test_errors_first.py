"""Errors a person reads first: a short backend repr, airstream's compile errors with the frames
of the user's code and the one frame where airstream raised (none of torch's, no other of
airstream's), a pass's signature checked when it is assigned, and a warning for a pass that returns
something."""

from __future__ import annotations

import functools
import traceback
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.conftest import cause_of, compile_model

import airstream
import airstream.compat.torchair as torchair
from airstream import PassError, StreamError

TORCH_DIR = str(Path(torch.__file__).parent)
AIRSTREAM_DIR = str(Path(airstream.__file__).parent)


def _model(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(torch.mm(x, x)) + 1


def _raising_pass(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    raise ValueError("boom in the pass")


def _unpaired_pass(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op == "call_function")
    with graph.inserting_before(first):
        graph.call_function(torch.ops.air.scope_enter.default, args=(["_user_stream_label"], ["s"]))


def _compile_error(pass_fn: Any) -> BaseException:
    """What compiling ``_model`` with ``pass_fn`` as the pre pass raises."""
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = pass_fn
    compiled, _ = compile_model(_model, config)
    with pytest.raises(Exception) as info:
        compiled(torch.randn(3, 3))
    return info.value


def _frames_below_backend(exc: BaseException) -> list[traceback.FrameSummary]:
    """The traceback's frames below airstream's backend entry point (AirstreamBackend.__call__)."""
    frames = traceback.extract_tb(exc.__traceback__)
    entry = [
        i
        for i, f in enumerate(frames)
        if f.filename == str(Path(AIRSTREAM_DIR, "backend.py")) and f.name == "__call__"
    ]
    assert entry, [f"{f.filename}:{f.name}" for f in frames]
    return frames[entry[0] + 1 :]


def test_pass_error_traceback_ends_in_the_pass_without_internal_frames() -> None:
    exc = _compile_error(_raising_pass)
    assert isinstance(cause_of(exc, PassError), PassError)
    below = _frames_below_backend(exc)
    # the frame where airstream raised (the pass manager, at its call of the pass), then the
    # user's frames: the pass and the line in it that raised
    manager = str(Path(AIRSTREAM_DIR, "passes", "manager.py"))
    assert [(f.filename, f.name) for f in below] == [
        (manager, "_run_one"),
        (__file__, "_raising_pass"),
    ]
    assert below[-1].line == 'raise ValueError("boom in the pass")'


def test_stream_error_traceback_leaves_out_torch_and_airstream_frames() -> None:
    exc = _compile_error(_unpaired_pass)
    error = cause_of(exc, StreamError)
    assert error is not None and "never closed" in str(error)
    # only the frame where airstream raised it: the stream analysis's check, its raise line
    below = _frames_below_backend(exc)
    assert [(f.filename, f.name) for f in below] == [
        (str(Path(AIRSTREAM_DIR, "graph", "stream_front_ends.py")), "walk")
    ]
    assert below[0].line is not None and below[0].line.startswith("raise StreamError(")
    # the error itself still names the pass that inserted the marker
    assert "_unpaired_pass" in str(error)


def test_verbose_flag_keeps_every_frame_and_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHDYNAMO_VERBOSE", "1")
    below = _frames_below_backend(_compile_error(_raising_pass))
    files = [f.filename for f in below]
    assert any(f.startswith(TORCH_DIR) for f in files), files  # AOTAutograd's frames
    assert str(Path(AIRSTREAM_DIR, "passes", "manager.py")) in files
    # the cause's frames continue the stack: it ends in the pass, as without the flag
    assert (below[-1].filename, below[-1].name) == (__file__, "_raising_pass")


def test_backend_repr_is_short_and_error_message_leads_with_airstream() -> None:
    assert repr(airstream.get_backend()) == "AirstreamBackend()"
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = [_raising_pass, _unpaired_pass]
    config.debug.run_eagerly = True
    assert repr(airstream.get_backend(config)) == (
        f"AirstreamBackend(post_grad_custom_pre_pass=[{__name__}._raising_pass, "
        f"{__name__}._unpaired_pass], debug.run_eagerly=True)"
    )
    first, second, *_ = str(_compile_error(_raising_pass)).splitlines()
    assert first == (
        f"backend='AirstreamBackend(post_grad_custom_pre_pass={__name__}._raising_pass)' raised:"
    )
    assert second.startswith(f"PassError: pass '{__name__}._raising_pass'")


def _two_args(gm: Any, example_inputs: Any) -> None:
    """Neither an airstream pass (gm, example_inputs, config) nor an Inductor one (graph)."""


class _CallableWithWrongArity:
    def __call__(self, gm: Any, example_inputs: Any) -> None:
        pass


def _def_line(fn: Any) -> int:
    return int(fn.__code__.co_firstlineno)


def test_pass_with_wrong_signature_is_rejected_on_assignment() -> None:
    config = airstream.CompilerConfig()
    with pytest.raises(TypeError) as info:
        config.post_grad_custom_pre_pass = _two_args
    message = str(info.value)
    assert message.startswith("post_grad_custom_pre_pass: the pass ")
    assert f"{__name__}._two_args ({__file__}:{_def_line(_two_args)})" in message
    assert "takes (gm: 'Any', example_inputs: 'Any')" in message
    assert "def my_pass(gm, example_inputs, config): ..." in message
    assert config.post_grad_custom_pre_pass is None  # nothing stored


def test_wrong_signature_in_a_list_names_its_index() -> None:
    config = airstream.CompilerConfig()
    bad = _CallableWithWrongArity()
    with pytest.raises(TypeError) as info:
        config.post_grad_custom_post_pass = [_raising_pass, bad]
    message = str(info.value)
    assert message.startswith("post_grad_custom_post_pass[1]: the pass ")
    call_line = _def_line(_CallableWithWrongArity.__call__)
    assert f"_CallableWithWrongArity.__call__ ({__file__}:{call_line})" in message
    with pytest.raises(TypeError, match="post_grad_custom_pre_pass: the pass"):
        airstream.CompilerConfig.from_options({"post_grad_custom_pre_pass": _two_args})


def _four(extra: int, gm: Any, example_inputs: Any, config: Any) -> None:
    pass


class _CallablePass:
    def __call__(self, gm: Any, example_inputs: Any, config: Any) -> None:
        pass


@pytest.mark.parametrize(
    ("accepted", "rejected"),
    [
        (_raising_pass, _two_args),
        (lambda *args: None, lambda *, gm: None),
        (lambda gm, example_inputs, config=None, *r, **kw: None, lambda gm, inputs, *, c: None),
        (functools.partial(_four, 1), functools.partial(_four, 1, 2)),
        (_CallablePass(), _CallableWithWrongArity()),
        (print, divmod),  # print's signature cannot be read: accepted; divmod's can
    ],
    ids=["function", "varargs", "defaults", "partial", "callable-object", "builtin"],
)
def test_signature_check_binds_three_positional_arguments(accepted: Any, rejected: Any) -> None:
    config = airstream.CompilerConfig()
    config.post_grad_custom_pre_pass = accepted
    config.post_grad_custom_post_pass = [accepted, accepted]
    assert config.post_grad_custom_pre_pass is accepted
    assert config.post_grad_custom_post_pass == (accepted, accepted)
    with pytest.raises(TypeError, match=r"^post_grad_custom_pre_pass: the pass .* takes \("):
        config.post_grad_custom_pre_pass = rejected
    assert config.post_grad_custom_pre_pass is accepted


def test_torchair_passes_are_checked_when_airstream_config_is_built() -> None:
    good = torchair.CompilerConfig()
    good.post_grad_custom_pre_pass = _raising_pass
    assert callable(good.airstream.post_grad_custom_pre_pass)
    bad = torchair.CompilerConfig()
    bad.post_grad_custom_pre_pass = _two_args
    with pytest.raises(TypeError, match=r"post_grad_custom_pre_pass: the pass .*_two_args \("):
        torchair.get_npu_backend(compiler_config=bad)


def _returns_new_module(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> Any:
    return torch.fx.GraphModule(gm, gm.graph)


def _returns_gm(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> Any:
    return gm


def _returns_none(gm: torch.fx.GraphModule, example_inputs: Any, config: Any) -> None:
    return None


def _pass_warnings(pass_fn: Any, *, slot: str = "post_grad_custom_pre_pass") -> list[Any]:
    """The UserWarnings compiling and running ``_model`` with ``pass_fn`` in ``slot`` gives."""
    config = airstream.CompilerConfig()
    config.set_option(slot, pass_fn)
    compiled, _ = compile_model(_model, config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(torch.randn(3, 3))
    return [w for w in caught if "returned" in str(w.message)]


def test_pass_returning_a_new_graph_module_warns_at_its_source_line() -> None:
    [warning] = _pass_warnings(_returns_new_module)
    assert warning.category is UserWarning
    assert (warning.filename, warning.lineno) == (__file__, _def_line(_returns_new_module))
    message = str(warning.message)
    assert f"'{__name__}._returns_new_module'" in message
    assert "returned a GraphModule other than gm" in message
    assert "return value of a pass is ignored: edit gm.graph in place" in message


def test_pass_returning_gm_or_a_value_warns_and_none_does_not() -> None:
    [warning] = _pass_warnings(_returns_gm, slot="post_grad_custom_post_pass")
    assert "(stage post_grad_custom_post_pass) returned gm itself" in str(warning.message)
    [warning] = _pass_warnings(lambda gm, example_inputs, config: 3)
    assert "returned a value of type int" in str(warning.message)
    assert _pass_warnings(_returns_none) == []
