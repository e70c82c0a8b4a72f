"""Runs as data: runs.load on hand-written run directories and on a real sweep; `andrea-exp-runs`."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from test_sweep import TINY, multirun

from andrea_exp.runs import frame as runs
from andrea_exp.runs.rundir import find_run_dirs, job_dirs


def write_job(job_dir: Path, overrides: list[str], config: dict, summary: dict | None, metrics: list[dict]) -> Path:
    """A run directory as Hydra and the training loop leave it (.hydra/, summary.json, metrics.jsonl)."""
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job_dir / ".hydra" / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    if summary is not None:
        (job_dir / "summary.json").write_text(json.dumps({**summary, "config": config}))
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return job_dir


@pytest.fixture
def sweep_dir(tmp_path) -> Path:
    """Three cells of a d_k sweep: finished, failed, and one killed before writing summary.json."""
    root = tmp_path / "grid"
    root.mkdir()
    (root / "multirun.yaml").write_text("hydra:\n  overrides:\n    task:\n    - model.d_k=8,16,32\n"
                                        "    - train.max_steps=3\n")
    write_job(root / "0", ["model.d_k=8", "train.max_steps=3"], {"model": {"d_k": 8, "causal": True}, "seed": 0},
              {"run/status": "finished", "eval/loss_as_trained": 1.5, "eval/gap": 0.0, "attn/entropy": "nan",
               "run/steps": 3},
              [{"step": 0, "train/loss": 3.0, "grad/norm": 0.5}, {"step": 1, "train/loss": 2.0},
               {"step": 2, "train/loss": 1.0}, {"step": 3, "eval/loss_as_trained": 1.5, "eval/sample": "1 2 3"}])
    write_job(root / "1", ["model.d_k=16", "train.max_steps=3"], {"model": {"d_k": 16, "causal": True}, "seed": 0},
              {"run/status": "failed", "run/error": "boom", "run/steps": 1}, [{"step": 0, "train/loss": "inf"}])
    write_job(root / "2", ["model.d_k=32", "train.max_steps=3"], {"model": {"d_k": 32, "causal": True}, "seed": 0},
              None, [])
    (root / "0" / "wandb").mkdir()  # W&B's folder is not a run
    return root


def test_run_dirs_are_found_in_job_order(tmp_path, sweep_dir):
    for n in (10, 3):
        write_job(sweep_dir / str(n), [], {}, None, [])
    assert [p.name for p in job_dirs(sweep_dir)] == ["0", "1", "2", "3", "10"]
    assert [p.name for p in find_run_dirs(tmp_path)] == ["0", "1", "2", "3", "10"]
    assert find_run_dirs(sweep_dir / "1") == [sweep_dir / "1"]
    with pytest.raises(FileNotFoundError, match="no such run or sweep directory"):
        find_run_dirs(tmp_path / "nowhere")


def test_one_row_per_run_with_status_summary_and_flattened_config(sweep_dir):
    pytest.importorskip("pandas")
    frame = runs.load(sweep_dir)
    assert list(frame["path"]) == [str(sweep_dir / n) for n in ("0", "1", "2")]
    assert list(frame["status"]) == ["finished", "failed", "missing"]
    assert list(frame["config.model.d_k"]) == [8, 16, 32]  # job 2 from .hydra/config.yaml: it wrote no summary
    assert frame.loc[0, "eval/loss_as_trained"] == 1.5 and frame.loc[1, "run/error"] == "boom"
    assert math.isnan(frame.loc[0, "attn/entropy"])  # stored as "nan" in JSON, read back as a float
    assert "run/status" not in frame.columns and "config" not in frame.columns
    assert list(runs.load(sweep_dir / "1", sweep_dir / "0")["path"]) == [str(sweep_dir / "1"), str(sweep_dir / "0")]


def test_history_is_long_form_numbers_only(sweep_dir):
    pytest.importorskip("pandas")
    frame = runs.load(sweep_dir, history=True)
    assert list(frame.columns) == ["path", "step", "key", "value"]
    rows = [(Path(p).name, s, k, v) for p, s, k, v in frame.itertuples(index=False)]
    assert rows == [("0", 0, "train/loss", 3.0), ("0", 0, "grad/norm", 0.5), ("0", 1, "train/loss", 2.0),
                    ("0", 2, "train/loss", 1.0), ("0", 3, "eval/loss_as_trained", 1.5),
                    ("1", 0, "train/loss", math.inf)]  # the text sample is left out; "inf" is a number again


def test_load_without_pandas_says_how_to_install_it(sweep_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match="pip install pandas"):
        runs.load(sweep_dir)


def test_command_prints_the_sweep_table_and_writes_csv(sweep_dir, tmp_path, capsys):
    pytest.importorskip("pandas")
    out = tmp_path / "cells.csv"
    (sweep_dir / "0" / "wandb_run_id").write_text("ab12cd34\n")  # cell 0's W&B run
    assert runs.main([str(sweep_dir), "--csv", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"[andrea-exp] sweep {sweep_dir}: 3 cells, 2 failed"
    assert lines[2].split() == ["0", "model.d_k=8", "finished", "1.5000", "0.0000", "nan", "ab12cd34"]
    assert lines[3].split() == ["1", "model.d_k=16", "failed", "-", "-", "-", "-"]  # only the swept key is shown
    assert lines[-3:] == ["  cell 1 failed: boom", "  cell 2: no summary.json (the job died before writing one)",
                          f"wrote 3 runs to {out}"]
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["status"], r["config.model.d_k"]) for r in rows] == [("finished", "8"), ("failed", "16"),
                                                                    ("missing", "32")]


def test_command_rejects_a_directory_that_is_not_a_sweep(tmp_path, capsys):
    assert runs.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"error: SWEEP_DIR {tmp_path / 'nowhere'} is not a directory"
    assert runs.main([str(tmp_path)]) == 2
    assert "holds no job directories" in capsys.readouterr().err


@pytest.mark.slow
def test_a_real_sweep_reads_back_as_it_printed(tmp_path):
    pytest.importorskip("pandas")
    proc, sweep_dir = multirun(tmp_path, "model.d_k=8,16", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stdout[proc.stdout.index("[andrea-exp] sweep "):].strip()
    again = subprocess.run([sys.executable, "-m", "andrea_exp.runs.frame", str(sweep_dir)], capture_output=True,
                           text=True, check=True).stdout.strip()
    assert again == printed  # the same table the multirun printed at its end
    frame = runs.load(sweep_dir)
    assert list(frame["status"]) == ["finished", "finished"] and list(frame["config.model.d_k"]) == [8, 16]
    history = runs.load(sweep_dir, history=True)
    loss = history[history["key"] == "train/loss"]
    assert sorted(loss.groupby("path")["step"].apply(list).tolist()) == [list(range(20))] * 2
    last = loss[loss["step"] == 19].set_index("path")["value"]
    for row in frame.to_dict("records"):  # the summary's last train/loss is the history's last value
        assert row["train/loss"] == last[row["path"]]
