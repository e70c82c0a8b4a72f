"""One run across processes with torchrun (gloo on CPU) matches a single process at the same global batch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

COMMON = ["train.max_steps=12", "train.batch_size=8", "train.eval_every=0", "train.log_every=4", "probe.every=0",
          "train.sample_tokens=4", "logger.mode=disabled", "train.progress=false", "train.device=cpu",
          "data.train_sequences=512", "data.eval_sequences=8"]


def _losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def _env() -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
                    reason="torchrun not installed")
def test_two_gloo_processes_match_one_process(tmp_path):
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    single, multi = tmp_path / "single", tmp_path / "ddp"
    subprocess.run([sys.executable, "-m", "andrea_exp", f"hydra.run.dir={single}", *COMMON],
                   check=True, env=_env(), capture_output=True, timeout=300)
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "andrea_exp",
                           f"hydra.run.dir={multi}", *COMMON], env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = _losses(single), _losses(multi)
    assert sorted(one) == sorted(two) == list(range(12))
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=1e-4, abs=1e-5), step
    summary = json.loads((multi / "summary.json").read_text())
    assert summary["train/world_size"] == 2
    assert json.loads((single / "summary.json").read_text())["train/world_size"] == 1
    assert done.stdout.count("[andrea-exp] finished") == 1  # only rank 0 reports


def test_torchrun_without_run_dir_is_one_line_error(tmp_path):
    env = _env() | {"WORLD_SIZE": "2", "RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "andrea_exp", "train.max_steps=1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "hydra.run.dir" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists()
