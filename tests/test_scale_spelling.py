"""model.scale typed as true or sqrt (false or none) is one value in summaries, the runs table, names and
checkpoints: variants.canonical_scale spells it sqrt / none / inv."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andrea_exp.config.variants import canonical_scale
from andrea_exp.runs import frame as runs
from andrea_exp.runs import rundir
from andrea_exp.runs.naming import run_name, split_override
from andrea_exp.training import checkpoint


@pytest.mark.parametrize("typed, canonical", [(True, "sqrt"), ("true", "sqrt"), ("True", "sqrt"), ("sqrt", "sqrt"),
                                              ("on", "sqrt"), (False, "none"), ("false", "none"), ("none", "none"),
                                              ("inv", "inv")])
def test_canonical_scale(typed, canonical):
    assert canonical_scale(typed) == canonical


def test_a_value_that_is_no_scale_is_left_for_the_settings_check_to_name():
    assert canonical_scale("maybe") == "maybe"


def test_names_and_the_sweep_table_spell_scale_one_way():
    assert split_override("model.scale=True") == split_override("model.scale=sqrt") == ("model.scale", "sqrt")
    assert split_override("+model.scale=false") == ("model.scale", "none")
    typed = [split_override(o) for o in ("model.d_k=64", "model.scale=False")]
    assert run_name(typed) == run_name([split_override(o) for o in ("model.d_k=64", "model.scale=none")]) == \
        "d_k=64 scale=none"


def test_summaries_record_the_canonical_scale(tmp_path, tiny_config):
    tiny_config.model.scale = True  # as typed on the command line
    rundir.write_summary(tmp_path, {"run/status": "finished"}, tiny_config)
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["model"]["scale"] == "sqrt"


def write_run(run_dir: Path, scale) -> None:
    """A run as an earlier version wrote it: the config's model.scale as it was typed."""
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"run/status": "finished", "config": {"model": {"scale": scale}}}))


def test_the_runs_table_has_one_value_however_scale_was_typed(tmp_path):
    pytest.importorskip("pandas")
    for name, scale in (("a", True), ("b", "sqrt"), ("c", False), ("d", "none")):
        write_run(tmp_path / name, scale)
    table = runs.load(tmp_path)
    assert list(table["config.model.scale"]) == ["sqrt", "sqrt", "none", "none"]


def test_a_checkpoint_that_recorded_true_resumes_as_sqrt(tmp_path, tiny_config):
    current = checkpoint.scientific_settings(tiny_config)
    assert current["model.scale"] == "sqrt"
    checkpoint.check_settings({**current, "model.scale": True}, current, tmp_path / "latest.pt")
    with pytest.raises(checkpoint.CheckpointError, match=r"differ from the checkpoint \S+: model.scale none -> sqrt;"):
        checkpoint.check_settings({**current, "model.scale": False}, current, tmp_path / "latest.pt")
