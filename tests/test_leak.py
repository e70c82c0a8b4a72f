"""Claim C7 end to end through the CLI: without the mask the model reads the future.

A non-causal run goes below the data's entropy floor (impossible for any causal predictor) and, at
generation time, above log V (worse than a uniform guess). A causal run does neither.
"""

import json
import math
import os
import subprocess
import sys

import pytest

SETTINGS = ["train.max_steps=300", "train.batch_size=16", "train.eval_every=0", "data.seq_len=32",
            "data.train_sequences=4096", "data.eval_sequences=32", "probe.every=0", "train.progress=false",
            "train.sample_tokens=4", "logger.mode=disabled"]


def train_summary(run_dir, causal: bool) -> dict:
    cmd = [sys.executable, "-m", "andrea_exp", f"model.causal={str(causal).lower()}", *SETTINGS,
           f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # two tiny runs; one thread each is fastest on a shared CPU
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300, env=env)
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
def test_leak_shows_below_floor_in_training_and_collapse_at_generation(tmp_path):
    leaky = train_summary(tmp_path / "no_mask", causal=False)
    masked = train_summary(tmp_path / "mask", causal=True)
    log_v = math.log(32)
    for run in (leaky, masked):
        assert run["run/status"] == "finished"

    assert leaky["eval/loss_as_trained"] < leaky["eval/floor"] - 0.3
    assert leaky["eval/below_floor"] > 0.3
    assert leaky["eval/loss_generation"] > log_v
    assert leaky["eval/gap"] > 3.0

    assert masked["eval/loss_as_trained"] >= masked["eval/floor"]
    assert masked["eval/loss_generation"] == masked["eval/loss_as_trained"]
    assert masked["eval/gap"] == 0.0
    assert masked["eval/loss_generation"] < log_v - 0.3  # it learned something, and honestly
