"""Grouping runs into experiments and cells: the study axes come from what a sweep varies, not from a list."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import compose_config
from omegaconf import OmegaConf

from andrea_exp.report.cells import TRAINING, group_experiments, study_axes
from andrea_exp.report.runs import load_runs


def write_run(run_dir: Path, cfg) -> None:
    """A finished run directory of the composed config CFG as the training loop leaves it (the resolved config in
    .hydra/ and in summary.json)."""
    config = OmegaConf.to_container(cfg, resolve=True)
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(config))
    (run_dir / "summary.json").write_text(json.dumps({"run/status": "finished", "config": config}))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "train/loss": 4.0}) + "\n")


def test_a_sweep_over_weight_decay_splits_cells_by_weight_decay(tmp_path):
    # a preset nobody listed anywhere sweeps train.weight_decay x seed; the probe cadence also differs
    # between jobs, which is bookkeeping and must split nothing
    job = 0
    for weight_decay in (0.0, 0.1, 0.3):
        for seed in (0, 1):
            cfg = compose_config("name=wd_study", f"train.weight_decay={weight_decay}", f"seed={seed}",
                                 f"probe.every={10 * (seed + 1)}", "logger.mode=disabled")
            write_run(tmp_path / "multirun" / "wd_study" / "2026-01-01_00-00-00" / str(job), cfg)
            job += 1
    runs = load_runs([tmp_path])
    assert len(runs) == 6
    assert study_axes(runs) == ["train.weight_decay"]
    (experiment,) = group_experiments(runs)
    assert (experiment.label, experiment.kind, experiment.axes) == ("wd_study", TRAINING, ["train.weight_decay"])
    assert [c.label for c in experiment.cells] == ["weight_decay=0.0", "weight_decay=0.1", "weight_decay=0.3"]
    assert all(sorted(c.seeds) == [0, 1] for c in experiment.cells)


def test_a_setting_that_differs_only_between_sweeps_tells_experiments_apart(tmp_path):
    # two sweeps of d_k, one at seq_len 32 and one at 64: d_k splits cells, seq_len splits experiments
    for seq_len in (32, 64):
        for job, d_k in enumerate((8, 16)):
            write_run(tmp_path / f"sweep_{seq_len}" / str(job),
                      compose_config("name=grid", f"data.seq_len={seq_len}", f"model.d_k={d_k}"))
    runs = load_runs([tmp_path])
    assert study_axes(runs) == ["model.d_k"]
    experiments = group_experiments(runs)
    assert [e.label for e in experiments] == ["grid (data.seq_len=32)", "grid (data.seq_len=64)"]
    assert all(e.axes == ["model.d_k"] and [c.label for c in e.cells] == ["d_k=8", "d_k=16"] for e in experiments)
