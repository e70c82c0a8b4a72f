"""A run directory that holds a run is never trained over without being asked (train.overwrite=true), and
train.resume=true only continues a run that is there. Refusals are one line, before any work, and leave every
file as it was, byte for byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny
from test_failures import one_line, summary

from andrea_exp.runs import run_guard

SMALL = tiny("train.max_steps=6", "train.eval_every=0", "train.sample_tokens=2")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0", "WANDB_MODE": "disabled"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "andrea_exp", *SMALL, *args], env=ENV, capture_output=True,
                          text=True, timeout=300)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("guard") / "run"
    done = cli(f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def interrupted_copy(finished: Path, tmp_path: Path) -> Path:
    """A run stopped at step 3 with a checkpoint: the finished run's files, its summary marked interrupted."""
    run_dir = tmp_path / "stopped"
    run_dir.mkdir()
    for path, data in snapshot(finished).items():
        (run_dir / path).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / path).write_bytes(data)
    (run_dir / "summary.json").write_text(json.dumps({**summary(finished), "run/status": "interrupted",
                                                      "run/steps": 3}))
    return run_dir


# ---------------------------------------------------------------- what a directory holds


def test_holding_tells_runs_apart(tmp_path):
    def held(status: str | None = None, steps: int = 0, metrics: str | None = None, checkpoint: bool = False) -> str:
        run_dir = tmp_path / str(len(list(tmp_path.iterdir())))
        (run_dir / ".hydra").mkdir(parents=True)
        if status is not None:
            (run_dir / "summary.json").write_text(json.dumps({"run/status": status, "run/steps": steps}))
        if metrics is not None:
            (run_dir / "metrics.jsonl").write_text(metrics)
        if checkpoint:
            (run_dir / "checkpoints").mkdir()
            (run_dir / "checkpoints" / "latest.pt").write_bytes(b"x")
        return run_guard.holding(run_dir).kind

    assert run_guard.holding(tmp_path / "absent").kind == run_guard.NEW
    assert held() == run_guard.NEW  # Hydra's .hydra/ only
    assert held(metrics="") == run_guard.NEW  # opened, nothing logged
    assert held("interrupted", 0) == run_guard.NOT_STARTED  # a stopped sweep's cell
    assert held("finished", 6, checkpoint=True) == run_guard.FINISHED
    assert held("diverged", 4) == run_guard.DIVERGED
    assert held("interrupted", 3, checkpoint=True) == run_guard.RESUMABLE
    assert held(checkpoint=True) == run_guard.RESUMABLE  # killed after a checkpoint
    assert held(metrics='{"step": 0}\n') == run_guard.STOPPED  # killed before one
    assert held("failed", 40) == run_guard.STOPPED


# ---------------------------------------------------------------- without train.resume


def test_a_finished_run_is_not_overwritten(finished):
    before = snapshot(finished)
    done = cli(f"hydra.run.dir={finished}", "train.max_steps=3")
    assert done.returncode == 2
    assert one_line(done) == (f"error: hydra.run.dir={finished} already holds a finished run (6 steps): choose a new "
                              "hydra.run.dir, or pass train.overwrite=true to replace it")
    assert snapshot(finished) == before  # .hydra/overrides.yaml included


def test_an_interrupted_run_is_not_restarted_without_resume(finished, tmp_path):
    run_dir = interrupted_copy(finished, tmp_path)
    before = snapshot(run_dir)
    done = cli(f"hydra.run.dir={run_dir}")
    assert done.returncode == 2
    assert one_line(done) == (f"error: hydra.run.dir={run_dir} already holds a run interrupted at step 3: pass "
                              "train.resume=true to continue it, choose a new hydra.run.dir, or pass "
                              "train.overwrite=true to replace it")
    assert snapshot(run_dir) == before


def test_overwrite_replaces_the_run_and_leaves_nothing_of_the_old_one(finished, tmp_path):
    run_dir = interrupted_copy(finished, tmp_path)
    (run_dir / "checkpoints" / "step-0000003.pt").write_bytes(b"old")
    (run_dir / ".hydra" / "resume-1").mkdir()
    done = cli(f"hydra.run.dir={run_dir}", "train.max_steps=4", "train.overwrite=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"train.overwrite=true: replacing a run interrupted at step 3 in {run_dir}" in done.stdout
    assert (summary(run_dir)["run/status"], summary(run_dir)["run/steps"]) == ("finished", 4)
    assert not (run_dir / "checkpoints" / "step-0000003.pt").exists() and not (run_dir / ".hydra" / "resume-1").exists()
    assert "train.max_steps=4" in (run_dir / ".hydra" / "overrides.yaml").read_text()


def test_a_new_or_empty_directory_is_trained_into(tmp_path):
    (tmp_path / "empty").mkdir()
    for run_dir in (tmp_path / "empty", tmp_path / "new"):
        done = cli(f"hydra.run.dir={run_dir}", "train.max_steps=2")
        assert done.returncode == 0, done.stderr[-3000:]


# ---------------------------------------------------------------- with train.resume


def test_resume_of_a_directory_that_holds_no_run_is_refused(tmp_path):
    done = cli(f"hydra.run.dir={tmp_path / 'tpyo'}", "train.resume=true")
    assert done.returncode == 2
    assert one_line(done).startswith(f"error: train.resume=true: hydra.run.dir={tmp_path / 'tpyo'} holds no run to "
                                     "continue")
    assert list(tmp_path.iterdir()) == []


def test_resume_of_a_run_with_no_checkpoint_is_refused_unless_asked_to_start_again(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"step": 0, "train/loss": 3.4}\n')  # killed before its first checkpoint
    before = snapshot(run_dir)
    done = cli(f"hydra.run.dir={run_dir}", "train.resume=true")
    assert done.returncode == 2
    assert one_line(done) == (f"error: train.resume=true: hydra.run.dir={run_dir} holds a run that stopped before "
                              "writing a checkpoint or a summary, so there is nothing to continue from; pass "
                              "train.overwrite=true to start it again from step 0, or choose a new run directory")
    assert snapshot(run_dir) == before
    again = cli(f"hydra.run.dir={run_dir}", "train.resume=true", "train.overwrite=true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary(run_dir)["run/status"] == "finished"


def test_resume_of_a_diverged_run_leaves_it_as_it_is(finished, tmp_path):
    run_dir = interrupted_copy(finished, tmp_path)
    (run_dir / "summary.json").write_text(json.dumps({**summary(finished), "run/status": "diverged", "run/steps": 4}))
    before = snapshot(run_dir)
    done = cli(f"hydra.run.dir={run_dir}", "train.resume=true")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{run_dir} already diverged at step 4; nothing to resume" in done.stdout
    assert snapshot(run_dir) == before


# ---------------------------------------------------------------- sweeps


def test_a_sweep_over_an_existing_sweep_is_refused_in_one_line(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = subprocess.run([sys.executable, "-m", "andrea_exp", "-m", *SMALL, "model.d_k=8,16",
                            f"hydra.sweep.dir={sweep_dir}"], env=ENV, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    before = snapshot(sweep_dir)
    again = subprocess.run([sys.executable, "-m", "andrea_exp", "-m", *SMALL, "model.d_k=8,16",
                            f"hydra.sweep.dir={sweep_dir}"], env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2
    assert one_line(again) == (f"error: hydra.sweep.dir={sweep_dir} already holds a sweep (2 cells: 2 finished): "
                               "choose a new hydra.sweep.dir, or pass train.overwrite=true to replace its cells")
    assert snapshot(sweep_dir) == before


def test_resume_of_a_sweep_directory_that_holds_no_sweep_is_refused(tmp_path):
    assert run_guard.sweep_refusal(tmp_path / "none", resume=True, overwrite=False).startswith(
        f"train.resume=true: hydra.sweep.dir={tmp_path / 'none'} holds no sweep to continue")
    assert run_guard.sweep_refusal(tmp_path / "none", resume=False, overwrite=False) is None


def test_a_resumed_sweep_starts_its_never_started_cells(tmp_path):
    """Cells that a stopped sweep never began (no directory, only Hydra's .hydra/, or a step-0 summary) start from
    step 0; a cell stopped before a first checkpoint is named."""
    sweep_dir = tmp_path / "sweep"
    (sweep_dir / "0" / ".hydra").mkdir(parents=True)
    (sweep_dir / "1" / ".hydra").mkdir(parents=True)
    (sweep_dir / "1" / "summary.json").write_text(json.dumps({"run/status": "interrupted", "run/steps": 0}))
    (sweep_dir / "multirun.yaml").write_text("{}\n")
    assert run_guard.sweep_refusal(sweep_dir, resume=True, overwrite=False) is None
    (sweep_dir / "2" / ".hydra").mkdir(parents=True)
    (sweep_dir / "2" / "metrics.jsonl").write_text('{"step": 0}\n')
    assert run_guard.sweep_refusal(sweep_dir, resume=True, overwrite=False) == (
        f"train.resume=true: cell 2 of hydra.sweep.dir={sweep_dir} stopped before a first checkpoint, so there is "
        "nothing to continue from; pass train.overwrite=true to start such cells again from step 0")
    assert run_guard.sweep_refusal(sweep_dir, resume=True, overwrite=True) is None
