"""Divergence is a result: the run stops early, says why, exits 0, and keeps what it logged."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tiny

from andrea_exp.training.loop import Diverged, DivergenceWatch

SMALL = tiny("data.train_sequences=500", "data.eval_sequences=32", "train.max_steps=200", "train.log_every=5")
BLOW_UP = ["train.lr=1e4", "train.warmup_steps=0", "train.grad_clip=0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_nan_loss_diverges_at_once():
    watch = DivergenceWatch(factor=3.0, patience=5)
    watch.check(0, 2.0, 1.0)
    with pytest.raises(Diverged, match="non-finite loss at step 1"):
        watch.check(1, math.nan, 1.0)


@pytest.mark.parametrize("gnorm", [math.inf, -math.inf, math.nan])
def test_non_finite_gradient_diverges(gnorm):
    with pytest.raises(Diverged, match="non-finite gradient norm at step 4"):
        DivergenceWatch(factor=3.0, patience=5).check(4, 2.0, gnorm)


def test_infinite_loss_is_named_as_the_loss():
    with pytest.raises(Diverged, match="non-finite loss"):
        DivergenceWatch(factor=3.0, patience=5).check(0, math.inf, math.inf)


def test_threshold_needs_patience_steps_in_a_row():
    watch = DivergenceWatch(factor=3.0, patience=3)
    watch.check(0, 1.0, 1.0)  # the initial loss: threshold 3.0
    for step, loss in enumerate([3.5, 3.5, 1.0, 3.0, 3.5, 3.5], start=1):  # 1.0 resets; 3.0 is not above
        watch.check(step, loss, 1.0)
    assert watch.streak == 2
    with pytest.raises(Diverged, match=r"above 3 x initial 1 for 3 steps at step 7"):
        watch.check(7, 3.01, 1.0)


def test_streak_survives_a_resume():
    before = DivergenceWatch(factor=2.0, patience=3)
    for step, loss in enumerate([1.0, 2.5, 2.5]):
        before.check(step, loss, 0.5)
    after = DivergenceWatch(factor=2.0, patience=3)
    after.load_state(before.state())
    assert (after.initial, after.streak) == (1.0, 2)
    with pytest.raises(Diverged):
        after.check(3, 2.5, 0.5)


def test_blown_up_run_ends_as_diverged_with_exit_0(tmp_path):
    done = subprocess.run([sys.executable, "-m", "andrea_exp", *SMALL, *BLOW_UP, f"hydra.run.dir={tmp_path}"],
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["run/status"] == "diverged"
    assert summary["run/error"].startswith(("non-finite", "loss "))
    failed_at = int(summary["run/error"].rsplit("step ", 1)[1])
    assert failed_at < summary["run/steps"] < 200  # stopped early: within one logging window of the failure
    assert summary["run/steps"] - failed_at <= 5
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/loss" in r]  # the training steps (the evaluation at step 0 has a row too)
    assert [r["step"] for r in rows] == list(range(summary["run/steps"]))  # every step it ran, the failing one too
    bad = rows[failed_at]["train/loss"]
    assert bad in ("nan", "inf") or float(bad) > 3 * rows[0]["train/loss"]
    assert not (tmp_path / "checkpoints" / "latest.pt").exists()  # a diverged model is not saved as final


def test_a_diverging_cell_does_not_stop_the_sweep(tmp_path):
    done = subprocess.run([sys.executable, "-m", "andrea_exp", "-m", *SMALL, "train.max_steps=20",
                           "train.warmup_steps=0", "train.grad_clip=0", "train.lr=1e4,3e-3",
                           f"hydra.sweep.dir={tmp_path}"], env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]  # a divergence is a result, not a failed cell
    status = [json.loads((tmp_path / cell / "summary.json").read_text())["run/status"] for cell in ("0", "1")]
    assert status == ["diverged", "finished"]
    assert Path(tmp_path / "1" / "checkpoints" / "latest.pt").exists()
