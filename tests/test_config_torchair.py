"""TorchAir's config as a view onto airstream's options: the mode table and the option table
are the one place that says what a TorchAir option does here."""

from __future__ import annotations

import pytest

import airstream
import airstream.compat.torchair as torchair
from airstream.compat.torchair import mapping


def test_the_mode_table_covers_torchairs_modes_and_names_airstreams() -> None:
    config = torchair.CompilerConfig()
    assert list(mapping.MODES) == config.mode.optional  # TorchAir's modes, in its order
    airstream_modes = ("reduce-overhead", "max-autotune")
    assert set(mapping.MODES.values()) <= set(airstream_modes)
    for mode in airstream_modes:  # each one is accepted by airstream's config
        airstream.CompilerConfig().mode = mode


@pytest.mark.parametrize("mode", sorted(mapping.MODES))
def test_each_torchair_mode_compiles_as_its_table_says(mode: str) -> None:
    config = torchair.CompilerConfig()
    config.mode = mode
    assert config.airstream.mode == mapping.MODES[mode]


def test_torchairs_default_is_airstreams_max_autotune_not_airstreams_default() -> None:
    """TorchAir's default (GE graph mode: the whole graph compiled) is airstream's
    max-autotune; airstream's own default is chosen per device (airstream.graph.mode)."""
    assert torchair.CompilerConfig().mode.value == "max-autotune"
    assert torchair.CompilerConfig().airstream.mode == "max-autotune"
    assert airstream.CompilerConfig().mode == "default"


def test_mode_is_in_the_option_table() -> None:
    assert mapping._AIRSTREAM["mode"].target == "mode"
    options = set(airstream.CompilerConfig.option_paths())
    assert {rule.target for rule in mapping._AIRSTREAM.values()} <= options
