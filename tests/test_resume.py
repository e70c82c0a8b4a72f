"""A run killed with SIGKILL and resumed with train.resume=true equals an unbroken run, record for record."""

from __future__ import annotations

import collections
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose_tiny, tiny

from andrea_exp.config.validation import validate
from andrea_exp.training import checkpoint

# small and quick on a 2-core CPU; log_every does not divide ckpt_every, so windows are cut at checkpoints
SMALL = tiny("data.train_sequences=500", "data.eval_sequences=32", "train.batch_size=16", "train.max_steps=120",
             "train.ckpt_every=20", "train.eval_every=20", "train.log_every=7", "probe.every=10",
             "probe.maps_every=0")
TIMING_KEYS = ("train/tokens_per_s",)  # wall-clock rates: the only values allowed to differ between runs
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0"}  # one thread: identical float sums


def command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "andrea_exp", *SMALL, f"hydra.run.dir={run_dir}", *extra]


def run(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command(run_dir, *extra), env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def by_step_and_key(recs: list[dict]) -> dict[tuple[int, str], object]:
    out = {}
    for rec in recs:
        for key, value in rec.items():
            if key != "step":
                assert (rec["step"], key) not in out, f"{key} logged twice at step {rec['step']}"
                out[rec["step"], key] = value
    return out


def checkpoint_step(run_dir: Path) -> int | None:
    try:
        return checkpoint.load(run_dir / "checkpoints")["step"]
    except (TypeError, checkpoint.CheckpointError):
        return None  # none yet


def assert_clean(recs: list[dict], max_steps: int) -> None:
    """Every train step exactly once, and each key's steps strictly increasing through the file."""
    assert [r["step"] for r in recs if "train/loss" in r] == list(range(max_steps))
    seen = collections.defaultdict(list)
    for rec in recs:
        for key in rec:
            if key != "step":
                seen[key].append(rec["step"])
    for key, steps in seen.items():
        assert all(a < b for a, b in zip(steps, steps[1:])), f"{key}: steps not strictly increasing: {steps}"


@pytest.fixture(scope="module")
def unbroken(tmp_path_factory) -> tuple[Path, str]:
    """The reference run, in a directory that exists and is empty."""
    run_dir = tmp_path_factory.mktemp("unbroken")
    return run_dir, run(run_dir).stdout


def test_resume_in_a_directory_with_no_run_is_refused_and_writes_nothing(tmp_path):
    """A mistyped directory is not trained from scratch: train.resume=true needs a run to continue."""
    run_dir = tmp_path / "typo"
    run_dir.mkdir()
    done = subprocess.run(command(run_dir, "train.resume=true"), env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: train.resume=true: hydra.run.dir={run_dir} holds no run to continue (no summary.json, metrics.jsonl "
        "or checkpoints/latest.pt); check the directory, or leave out train.resume to start a new run"]
    assert list(run_dir.iterdir()) == []


def test_the_reference_run_trains_every_step_once(unbroken):
    run_dir, out = unbroken
    assert "resuming" not in out
    assert [r["step"] for r in records(run_dir) if "train/loss" in r] == list(range(120))


def test_killed_run_resumes_to_the_unbroken_result(unbroken, tmp_path):
    unbroken = unbroken[0]
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen(command(run_dir), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while (checkpoint_step(run_dir) or 0) < 40:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no checkpoint at step >= 40 in time"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    killed_at = checkpoint_step(run_dir)
    assert 40 <= killed_at < 120 and killed_at % 20 == 0

    out = run(run_dir, "train.resume=true").stdout
    assert f"resuming {run_dir} from step {killed_at}" in out

    resumed, reference = records(run_dir), records(unbroken)
    assert_clean(resumed, 120)
    got, want = by_step_and_key(resumed), by_step_and_key(reference)
    assert got.keys() == want.keys()  # no missing, no extra record: eval and probe at the checkpoint step included
    losses = [got[s, "train/loss"] for s in range(120)]
    assert losses == [want[s, "train/loss"] for s in range(120)]  # identical, not merely close
    assert all(got[k] == want[k] for k in want if k[1] not in TIMING_KEYS)
    assert ("eval/loss_as_trained" in {k for _, k in got}) and (killed_at, "eval/loss_as_trained") in got
    summary, reference_summary = (json.loads((d / "summary.json").read_text()) for d in (run_dir, unbroken))
    assert summary["run/status"] == "finished" and summary["run/steps"] == 120
    for key in ("eval/loss_as_trained", "best/eval/loss_as_trained", "train/loss", "eval/sample"):
        assert summary[key] == reference_summary[key], key


def test_resuming_a_finished_run_repeats_no_record(unbroken, tmp_path):
    unbroken = unbroken[0]
    run_dir = tmp_path / "again"
    run_dir.mkdir()
    for name in ("metrics.jsonl", "checkpoints"):
        source = unbroken / name
        if source.is_dir():
            (run_dir / name).mkdir()
            (run_dir / name / checkpoint.LATEST).write_bytes((source / checkpoint.LATEST).read_bytes())
        else:
            (run_dir / name).write_bytes(source.read_bytes())
    run(run_dir, "train.resume=true")
    again, reference = by_step_and_key(records(run_dir)), by_step_and_key(records(unbroken))
    assert again.keys() == reference.keys()
    assert all(again[k] == reference[k] for k in reference if k[1] not in TIMING_KEYS)


def test_a_truncated_checkpoint_is_one_clear_line(tmp_path):
    run_dir = tmp_path / "broken"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / checkpoint.LATEST).write_bytes(b"PK\x03\x04 cut short")
    done = subprocess.run(command(run_dir, "train.resume=true"), env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: train.resume: cannot read the checkpoint"), done.stderr
    assert not (run_dir / "metrics.jsonl").exists()


def _tiny_training_state(steps: int = 1, seed: int = 0):
    """A model, AdamW and a warm-up + cosine schedule after `steps` updates."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.SequentialLR(
        optimizer, [torch.optim.lr_scheduler.LinearLR(optimizer, 0.1, total_iters=2),
                    torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=5)], milestones=[2])
    for _ in range(steps):
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    return model, optimizer, scheduler


def test_checkpoint_holds_no_code_and_restores_every_random_stream(tmp_path):
    model, optimizer, scheduler = _tiny_training_state()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0, 1)  # leaves a cached gauss value in Python's state
    checkpoint.save(tmp_path, step=7, model=model, optimizer=optimizer, scheduler=scheduler,
                    extra={"best_eval": math.inf, "records_at_step": [{"eval/loss": 1.5}]})
    expected = (random.random(), random.gauss(0, 1), np.random.rand(), torch.rand(2))
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)

    state = torch.load(tmp_path / checkpoint.LATEST, weights_only=True)  # refuses anything but plain data
    assert state["step"] == 7 and state["extra"]["best_eval"] == math.inf
    assert not (tmp_path / (checkpoint.LATEST + ".tmp")).exists()
    checkpoint.set_rng_state(state["rng"])
    got = (random.random(), random.gauss(0, 1), np.random.rand(), torch.rand(2))
    assert got[:3] == expected[:3] and torch.equal(got[3], expected[3])


def test_restore_brings_back_weights_optimizer_moments_and_schedule(tmp_path):
    model, optimizer, scheduler = _tiny_training_state(steps=1)
    checkpoint.save(tmp_path, step=1, model=model, optimizer=optimizer, scheduler=scheduler, extra={})
    saved = checkpoint.load(tmp_path)
    # restored into a run at another step, with other weights: every compared value differs before restore
    other, other_opt, other_sched = _tiny_training_state(steps=3, seed=1)
    moments = ("exp_avg", "exp_avg_sq", "step")
    before = other_opt.state_dict()["state"]
    assert all(not torch.equal(before[i][m], saved["optimizer"]["state"][i][m]) for i in before for m in moments)
    assert other_sched.get_last_lr() != scheduler.get_last_lr()
    assert other_sched.last_epoch != scheduler.last_epoch

    checkpoint.restore(saved, model=other, optimizer=other_opt, scheduler=other_sched, max_steps=5, path=tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    after = other_opt.state_dict()["state"]
    assert after.keys() == saved["optimizer"]["state"].keys()
    for i in after:
        for m in moments:
            assert torch.equal(after[i][m], saved["optimizer"]["state"][i][m]), (i, m)
    assert other_sched.last_epoch == scheduler.last_epoch
    assert other_sched.get_last_lr() == scheduler.get_last_lr()
    assert [g["lr"] for g in other_opt.param_groups] == [g["lr"] for g in optimizer.param_groups]
    scheduler.step()
    other_sched.step()  # and the schedule carries on from the same point
    assert other_sched.get_last_lr() == scheduler.get_last_lr()


def test_another_schedule_is_refused(tmp_path):
    model, optimizer, scheduler = _tiny_training_state()
    checkpoint.save(tmp_path, step=1, model=model, optimizer=optimizer, scheduler=scheduler, extra={"max_steps": 5})
    with pytest.raises(checkpoint.CheckpointError, match=r"train.max_steps must equal the checkpoint's \(5\)"):
        checkpoint.restore(checkpoint.load(tmp_path), model=model, optimizer=optimizer, scheduler=scheduler,
                           max_steps=6, path=tmp_path)


def test_a_model_of_another_shape_is_refused(tmp_path):
    model, optimizer, scheduler = _tiny_training_state()
    checkpoint.save(tmp_path, step=1, model=model, optimizer=optimizer, scheduler=scheduler, extra={})
    wider = torch.nn.Linear(3, 4)
    with pytest.raises(checkpoint.CheckpointError, match="holds a different model"):
        checkpoint.restore(checkpoint.load(tmp_path), model=wider, optimizer=torch.optim.AdamW(wider.parameters()),
                           scheduler=scheduler, max_steps=5, path=tmp_path)


# ---------------------------------------------------------------- dropout: the random streams must be restored

DROPOUT = ("train.max_steps=30", "train.warmup_steps=5", "train.eval_every=0", "train.ckpt_every=10",
           "train.log_every=5", "train.device=cpu", "train.sample_tokens=2", "model.dropout=0.1")
CRASH_AT = 20


class Crash(Exception):
    """Stands for the process dying right after a checkpoint."""


def train_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in records(run_dir) if "train/loss" in r}


@pytest.fixture(scope="module")
def dropout_unbroken(tmp_path_factory) -> dict[int, float]:
    from andrea_exp.training.loop import train

    run_dir = tmp_path_factory.mktemp("dropout-unbroken")
    train(validate(compose_tiny(*DROPOUT)), run_dir)
    return train_losses(run_dir)


def crash_then_resume(run_dir: Path, monkeypatch) -> dict[int, float]:
    """Train until the checkpoint at CRASH_AT is written, die there, resume in the same process."""
    from andrea_exp.training.loop import train

    run_dir.mkdir()
    real_save = checkpoint.save

    def save_then_crash(directory, *, step, **kwargs):
        path = real_save(directory, step=step, **kwargs)
        if step == CRASH_AT:
            raise Crash(f"killed after the checkpoint at step {step}")
        return path

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "save", save_then_crash)
        with pytest.raises(Crash):
            train(validate(compose_tiny(*DROPOUT)), run_dir)
    assert max(train_losses(run_dir)) == CRASH_AT - 1
    torch.manual_seed(12345)  # the resumed process starts from other random streams than the crashed one had
    train(validate(compose_tiny(*DROPOUT, "train.resume=true")), run_dir)
    return train_losses(run_dir)


def test_with_dropout_a_resumed_run_equals_the_unbroken_one(dropout_unbroken, tmp_path, monkeypatch):
    resumed = crash_then_resume(tmp_path / "run", monkeypatch)
    assert sorted(resumed) == list(range(30))
    assert resumed == dropout_unbroken  # bit for bit, the steps after the resume included
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["run/steps"], summary["run/start_step"]) == (30, CRASH_AT)  # the segment ran 10 of the 30


def test_without_the_random_streams_the_resumed_run_differs(dropout_unbroken, tmp_path, monkeypatch):
    """The control that shows the test above can fail: dropout draws different masks after the resume."""
    monkeypatch.setattr(checkpoint, "set_rng_state", lambda state: None)
    resumed = crash_then_resume(tmp_path / "run", monkeypatch)
    assert all(resumed[s] == dropout_unbroken[s] for s in range(CRASH_AT))  # before the crash: the same run
    assert all(resumed[s] != dropout_unbroken[s] for s in range(CRASH_AT, 30))


def test_resuming_a_cell_that_a_stopped_sweep_never_started_says_so(tmp_path, capsys, tiny_config):
    """A local sweep stopped by Ctrl-C records its unstarted cells as interrupted at step 0: resumed, each
    starts from step 0 and is called what it is, not a run whose checkpoint went missing."""
    from andrea_exp.runs.rundir import write_summary
    from andrea_exp.training.loop import load_resume_state

    cfg = tiny_config
    cfg.train.resume, cfg.train.max_steps = True, 10
    write_summary(tmp_path, {"run/status": "interrupted", "run/steps": 0,
                             "run/error": "not started: the sweep was stopped by SIGINT"}, cfg)
    assert load_resume_state(validate(cfg).train, tmp_path, {}, is_main=True) is None
    out = capsys.readouterr().out
    assert f"{tmp_path} never started; starting it from step 0" in out and "holds no checkpoint" not in out
