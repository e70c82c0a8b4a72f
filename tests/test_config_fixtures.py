"""The composed tiny config (tests/conftest.py): composed once, read-only, and each test's copy is its own and
stays typed by the schema."""

import pytest
from conftest import compose_tiny
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ReadonlyConfigError, ValidationError

from andrea_exp.config.schema import TrainSchema


def test_the_copy_is_the_composed_tiny_preset(tiny_config):
    assert tiny_config == compose_tiny()
    assert OmegaConf.get_type(tiny_config.train) is TrainSchema


def test_a_change_stays_in_the_tests_copy(tiny_config, composed_tiny):
    tiny_config.train.max_steps = composed_tiny.train.max_steps + 7  # a nested value
    assert tiny_config.train.max_steps != composed_tiny.train.max_steps
    with pytest.raises(ReadonlyConfigError):
        composed_tiny.train.max_steps = 7


def test_the_copy_refuses_what_the_schema_refuses(tiny_config):
    with pytest.raises(ValidationError):
        tiny_config.train.max_steps = "many"
    with pytest.raises(ConfigAttributeError):
        tiny_config.train.max_stpes = 7
