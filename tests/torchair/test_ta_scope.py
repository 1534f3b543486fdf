"""Ports of TorchAir's ``torchair_scope_st.py``.

Only the argument check of ``torchair.scope.op_never_timeout`` is ported: the other upstream
tests assert attributes on GE graph ops (stream label/priority, super-kernel scope, core
limits, never-timeout) or read GE's data-dump JSON, which need the NPU graph engine.
"""

from __future__ import annotations

import pytest
from tests.torchair.conftest import upstream

import torchair

ST = "tests/st/torchair_scope_st.py::"


@upstream(ST + "test_never_timeout_scope_invalid_arg")
def test_never_timeout_scope_invalid_arg():
    with pytest.raises(TypeError) as info:
        with torchair.scope.op_never_timeout(enable=1):
            pass
    assert str(info.value).startswith("op_never_timeout() argument 'enable' must be bool"), str(
        info.value
    )
