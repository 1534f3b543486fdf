"""Ports of TorchAir's ``torchair_gear_st.py``: ``torchair.inference.set_dim_gears`` argument
checks (exact AssertionError messages) and compiling a model whose input carries many gears.

The GE-option tests (``generate_dynamic_dims_option``), the multi-gear GE executor tests and the
``GeConcreteGraph`` recompile hook are NPU-only and not ported.
"""

from __future__ import annotations

import pytest
import torch
from tests.torchair.conftest import upstream
from torchair.configs.compiler_config import CompilerConfig
from torchair.inference import set_dim_gears

import torchair

ST = "tests/st/torchair_gear_st.py::"


@upstream(ST + "test_set_dim_gears_twice")
def test_set_dim_gears_twice():
    x = torch.ones([2, 2])
    set_dim_gears(x, {1: [1, 2]})
    set_dim_gears(x, {1: [1, 2]})  # the same gears again are accepted
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0: [1, 2], 1: [1, 2]})
    assert str(info.value) == (
        f"Tensor {x} already has set dim gears, and it is not supported to set it again."
    )


@upstream(ST + "test_set_dim_gears_dim_index_not_it")
def test_set_dim_gears_dim_index_not_it():
    x = torch.ones([2, 2])
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0.3: [1, 2]})
    assert str(info.value) == (
        "Dim index in dim_gears must be an integer, but got <class 'float'>."
    )


@upstream(ST + "test_set_dim_gears_value_not_list_or_tuple")
def test_set_dim_gears_value_not_list_or_tuple():
    x = torch.ones([2, 2])
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0: 1})
    assert str(info.value) == (
        "Gears for dim index 0 in dim_gears must be a list or tuple, but got <class 'int'>."
    )


@upstream(ST + "test_set_dim_gears_dim_index_out_of_range")
def test_set_dim_gears_dim_index_out_of_range():
    x = torch.ones([2, 2])
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0: [1, 2], 2: [1, 2]})
    assert str(info.value) == "Dim index in dim_gears must be in range [0, 1], but got 2."


@upstream(ST + "test_set_dim_gears_value_not_int")
def test_set_dim_gears_value_not_int():
    x = torch.ones([2, 2])
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0: [1, 1.5]})
    assert str(info.value) == (
        "Element at index 1 of value for dim index 0 in dim_gears must be an integer, "
        "but got <class 'float'>."
    )


@upstream(ST + "test_set_dim_gears_value_lens_out_of_range")
def test_set_dim_gears_value_lens_out_of_range():
    x = torch.ones([2, 2])
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0: list(range(1, 102))})
    assert str(info.value) == (
        "Length of gears for dim index 0 in dim_gears must be in range [2, 100], but got 101."
    )


@upstream(ST + "test_set_dim_gears_value")
def test_set_dim_gears_value():
    x = torch.ones([2, 2])
    with pytest.raises(AssertionError) as info:
        set_dim_gears(x, {0: [0, 2]})
    assert str(info.value) == "Gear value at index 0 for dim index 0 must not be 0, but got 0."


@upstream(ST + "test_not_parse_stack_over")
def test_not_parse_stack_over():
    class Model(torch.nn.Module):
        def forward(self, x):
            return x * 2

    backend = torchair.get_npu_backend(compiler_config=CompilerConfig())
    model = torch.compile(Model(), backend=backend, dynamic=True)
    y = torch.ones([8, 8, 8])
    # 98 gears on one dim: guarding on them must not overflow the guard parser
    set_dim_gears(y, {0: list(range(1, 99))})
    torch.testing.assert_close(model(y), y * 2)
