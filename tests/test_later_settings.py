"""A scientific setting added after runs were recorded: those runs read, pool and resume as its default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andrea_exp.config.schema import fill_later_settings, recorded_default
from andrea_exp.runs.rundir import read_config
from andrea_exp.training.checkpoint import CheckpointError, check_settings


def test_a_missing_setting_reads_as_its_default_and_a_recorded_one_stays():
    old = {"model": {"d_k": 64, "scale": "sqrt"}, "train": {"lr": 1e-3}}
    filled = fill_later_settings(old)
    assert (filled["model"]["sigma_reparam"], filled["model"]["logit_softcap"], filled["train"]["z_loss"]) == (
        False, None, 0.0)
    assert filled["model"]["d_k"] == 64 and "sigma_reparam" not in old["model"]  # the input is left as it was
    set_on = fill_later_settings({"train": {"z_loss": 1e-4}})
    assert set_on["train"]["z_loss"] == 1e-4 and "model" not in set_on  # a group the run does not hold stays out


def test_operational_and_required_settings_have_no_recorded_default():
    from omegaconf import MISSING

    assert recorded_default("train.z_loss") == 0.0
    assert recorded_default("seed") is MISSING  # operational: never filled
    assert recorded_default("train.lr") is MISSING  # a yaml must set it: no default to assume
    assert "lr" not in fill_later_settings({"train": {}})["train"]


def test_a_run_recorded_before_the_setting_pools_with_one_that_set_the_default(tmp_path: Path):
    for name, extra in (("old", {}), ("new", {"z_loss": 0.0})):
        (tmp_path / name).mkdir()
        config = {"model": {"d_k": 64}, "train": {"lr": 1e-3, **extra}}
        (tmp_path / name / "summary.json").write_text(json.dumps({"run/status": "finished", "config": config}))
    assert read_config(tmp_path / "old")["train"] == read_config(tmp_path / "new")["train"]


def test_resuming_a_checkpoint_saved_before_the_setting(tmp_path: Path):
    saved = {"model.d_k": 64, "train.lr": 1e-3}
    check_settings(saved, {**saved, "train.z_loss": 0.0, "model.sigma_reparam": False}, tmp_path)  # as it ran
    with pytest.raises(CheckpointError, match=r"train.z_loss 0.0 -> 0.01"):
        check_settings(saved, {**saved, "train.z_loss": 0.01}, tmp_path)
