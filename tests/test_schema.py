"""The settings' schema: every yaml key is typed, every rule sits beside its field, and what is derived from it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import compose_config
from omegaconf import OmegaConf

from andrea_exp.config import schema
from andrea_exp.config.schema import CONF_DIR, SCIENTIFIC_KEYS, SETTINGS, find_conf_dir, is_scientific
from andrea_exp.config.validation import ConfigError, validate

OPTIONS = {group: sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
           for group in ("model", "data", "experiment")}


def test_the_yaml_files_extend_the_stored_schema():
    assert OmegaConf.load(CONF_DIR / "config.yaml").defaults[0] == "base_config"
    cfg = compose_config()
    assert OmegaConf.get_type(cfg.train) is schema.TrainSchema and OmegaConf.get_type(cfg) is schema.Config


@pytest.mark.parametrize("choice", [f"{g}={o}" for g, opts in OPTIONS.items() for o in opts])
def test_every_preset_sets_only_schema_keys_and_every_required_one(choice):
    cfg = compose_config(choice)
    keys = {f"{group}.{leaf}" for group in schema.GROUPS for leaf in cfg[group]}
    keys |= {name for name in cfg if name not in schema.GROUPS}
    assert keys == set(SETTINGS)
    missing = [key for key in SETTINGS if OmegaConf.is_missing(cfg, key) and key != "data.path"]
    assert missing == []


def test_every_setting_has_a_rule_and_a_role():
    for key, spec in SETTINGS.items():
        assert hasattr(spec.metadata["rule"], "check"), key
        assert isinstance(spec.metadata["operational"], bool), key


def bad_value(rule):
    """A value the rule refuses, chosen from the rule alone."""
    if isinstance(rule, schema.Integer):
        return rule.minimum - 1
    if isinstance(rule, schema.Finite):
        return float("nan")
    return "not-an-allowed-value"


@pytest.mark.parametrize("key", [k for k in SETTINGS if k not in ("data.path",)])
def test_validate_walks_every_setting_of_the_schema(key):
    """Each field's rule is applied by validate(): a value it refuses comes back as one line naming the key."""
    spec = SETTINGS[key]
    sources = spec.metadata["sources"]
    cfg = compose_config(f"data={sources[0]}") if sources and "markov" not in sources else compose_config()
    if isinstance(spec.metadata["rule"], (schema.Text, schema.TextList)):
        value = 3  # a number where text is wanted
    else:
        value = bad_value(spec.metadata["rule"])
    cfg = OmegaConf.create(OmegaConf.to_container(cfg))  # untyped: the value reaches validate() unconverted
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value).startswith(key), str(err.value)
    assert "\n" not in str(err.value)


def test_each_rule_message_says_what_is_allowed():
    cases = [(schema.Integer(1), 0, "k must be an integer >= 1; got 0"),
             (schema.Integer(0), True, "k must be an integer >= 0; got True"),
             (schema.Finite(low=0, low_inclusive=False), 0.0, "k must be a finite number > 0; got 0.0"),
             (schema.Finite(low=0, high=1), 1.5, "k must be a finite number >= 0 and <= 1; got 1.5"),
             (schema.Choice((True, False)), 1, "k must be one of True, False; got 1"),
             (schema.Choice(("a", "b")), "c", "k must be one of a, b; got 'c'"),
             (schema.Device(), "tpu", "k must be auto, cpu, cuda or cuda:N; got 'tpu'")]
    for rule, value, message in cases:
        with pytest.raises(ConfigError) as err:
            rule.check("k", value)
        assert str(err.value) == message
    accepted = ((schema.Integer(1), 1), (schema.Finite(low=0, high=1), 1), (schema.Choice((True, False)), False),
                (schema.Device(), "cuda:3"))
    for rule, value in accepted:
        rule.check("k", value)  # accepted: no error


def test_model_scale_keeps_its_permissive_values():
    for value in ("true", "false", "sqrt", "none", "inv", "on"):
        assert compose_config(f"model.scale={value}").model.scale is not None
    cfg = compose_config("model.scale=inv")
    validate(cfg)


def test_scientific_and_operational_settings():
    for key in ("model.d_k", "model.scale", "model.causal", "data.seq_len", "data.path", "train.lr",
                "train.warmup_steps", "train.precision", "model", "data", "train", "model.some_new_key"):
        assert is_scientific(key), key
    for key in ("seed", "name", "cells_per_gpu", "model.name", "logger", "logger.mode", "probe", "probe.every",
                "probe.dead_jac", "probe.dead_grad", "probe.dense_until", "probe.dense_every", "train.device",
                "train.progress", "train.progress_every", "train.keep_checkpoints", "train.eval_every",
                "train.ckpt_every", "train.compile", "train.resume", "hydra", "hydra.run.dir",
                "hydra.launcher.n_jobs", "launcher.partition"):
        assert not is_scientific(key), key
    assert set(SCIENTIFIC_KEYS) == {key for key in SETTINGS if is_scientific(key)}
    assert "model.d_k" in SCIENTIFIC_KEYS and "seed" not in SCIENTIFIC_KEYS


def test_conf_dir_prefers_the_configs_shipped_in_the_package(tmp_path):
    package = tmp_path / "site" / "andrea_exp"
    (package / "conf").mkdir(parents=True)
    (package / "conf" / "config.yaml").write_text("seed: 0\n")
    assert find_conf_dir(package) == package / "conf"
    checkout = tmp_path / "checkout"
    (checkout / "andrea_exp").mkdir(parents=True)
    (checkout / "conf").mkdir()
    (checkout / "conf" / "config.yaml").write_text("seed: 0\n")
    assert find_conf_dir(checkout / "andrea_exp") == checkout / "conf"
    checkout_conf = Path(schema.__file__).resolve().parent.parent.parent / "conf"
    assert checkout_conf == CONF_DIR  # this checkout
