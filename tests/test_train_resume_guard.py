"""Resume integrity: changed scientific settings are refused, a finished run is left alone, the original .hydra/
files are never overwritten, and train.resume needs the run's directory. "Untouched" means byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny

SMALL = tiny("train.max_steps=6", "train.eval_every=0", "train.sample_tokens=2")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0", "WANDB_MODE": "disabled"}


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "andrea_exp", *args], env=ENV, capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("guard") / "run"
    done = cli(*SMALL, f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_changed_scientific_settings_are_refused_in_one_line_and_nothing_is_written(finished):
    before = snapshot(finished)
    done = cli(*SMALL, "model.d_k=8", "train.lr=0.01", f"hydra.run.dir={finished}", "train.resume=true")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "model.d_k 16 -> 8" in lines[0] and "train.lr 0.003 -> 0.01" in lines[0]
    assert snapshot(finished) == before


def test_resuming_a_finished_run_says_so_and_rewrites_nothing(finished):
    before = snapshot(finished)
    # operational settings may differ on resume: cadence, logging, progress
    done = cli(*SMALL, "train.eval_every=2", "train.progress_every=1", f"hydra.run.dir={finished}",
               "train.resume=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{finished} already finished (6 steps); nothing to resume" in done.stdout
    assert snapshot(finished) == before


def test_resume_without_a_run_dir_is_one_line_error(tmp_path):
    done = cli(*SMALL, "train.resume=true", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: train.resume=true needs hydra.run.dir=DIR naming the run to continue (the default directory is "
        "new, with a time stamp)"]
    assert list(tmp_path.iterdir()) == []


def test_each_resume_keeps_its_overrides_beside_the_original(tmp_path):
    run_dir = tmp_path / "run"
    first = cli(*SMALL, "train.max_steps=4", "train.ckpt_every=2", f"hydra.run.dir={run_dir}")
    assert first.returncode == 0, first.stderr[-3000:]
    original = {name: (run_dir / ".hydra" / name).read_bytes() for name in ("config.yaml", "overrides.yaml")}
    # a finished run is left alone; without its summary.json it reads as unfinished and resumes at its last step
    (run_dir / "summary.json").unlink()
    for attempt in (1, 2):
        done = cli(*SMALL, "train.max_steps=4", "train.ckpt_every=2", "train.log_every=3",
                   f"hydra.run.dir={run_dir}", "train.resume=true")
        assert done.returncode == 0, done.stderr[-3000:]
        overrides = (run_dir / ".hydra" / f"resume-{attempt}" / "overrides.yaml").read_text()
        assert "train.resume=true" in overrides and "train.log_every=3" in overrides
        (run_dir / "summary.json").unlink()
    assert {name: (run_dir / ".hydra" / name).read_bytes() for name in original} == original
