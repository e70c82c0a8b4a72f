"""One run across processes with torchrun (gloo on CPU) matches a single process at the same global batch.

The tolerance (1e-5) sits between the two things it must tell apart: a correct DDP run differs from one
process only by the order of float sums (below 1e-6 here), while a run whose gradients are not averaged
across processes is off by far more after a few steps past warm-up. The negative control runs exactly that
broken run and checks the comparison would catch it, so the comparison itself is tested.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

STEPS = 30
COMMON = [f"train.max_steps={STEPS}", "train.batch_size=8", "train.warmup_steps=5", "train.eval_every=10",
          "train.log_every=5", "probe.every=0", "train.sample_tokens=4", "logger.mode=disabled",
          "train.progress=false", "train.device=cpu", "data.train_sequences=512", "data.eval_sequences=8"]
TOL = 1e-5
TORCHRUN = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
needs_torchrun = pytest.mark.skipif(not Path(TORCHRUN).exists(), reason="torchrun not installed")

# Runs the app with DDP replaced by the bare module: each process trains on its own half of the batch and
# gradients are never averaged. Everything else (the loss all-reduce, rank 0 writing) stays as it is.
NO_GRAD_SYNC = """
import sys
import torch
torch.nn.parallel.DistributedDataParallel = lambda module, **kwargs: module
from andrea_exp.launch.cli import main
main()
"""


def _env() -> dict:
    env = dict(os.environ, WANDB_MODE="disabled", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def _records(run_dir: Path) -> dict[tuple[int, str], float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.update({(row["step"], k): v for k, v in row.items() if isinstance(v, float)})
    return out


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=True)["model"]


def _torchrun(run_dir: Path, *extra: str, script: str | None = None, timeout: float = 300):
    target = [script] if script else ["-m", "andrea_exp"]
    return subprocess.run([TORCHRUN, "--standalone", "--nproc_per_node=2", *target, f"hydra.run.dir={run_dir}",
                           *COMMON, *extra], env=_env(), capture_output=True, text=True, timeout=timeout)


def largest_differences(a: Path, b: Path) -> dict[str, float]:
    """Largest absolute difference between two runs, per compared quantity, over every step it was logged."""
    ra, rb = _records(a), _records(b)
    out = {}
    for key in ("train/loss", "grad/norm", "eval/loss_as_trained"):
        steps = sorted(s for s, k in ra if k == key)
        assert steps and steps == sorted(s for s, k in rb if k == key), key
        out[key] = max(abs(ra[s, key] - rb[s, key]) for s in steps)
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    out["weights"] = max((wa[n] - wb[n]).abs().max().item() for n in wa)
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("single")
    subprocess.run([sys.executable, "-m", "andrea_exp", f"hydra.run.dir={run_dir}", *COMMON],
                   check=True, env=_env(), capture_output=True, timeout=300)
    return run_dir


@needs_torchrun
def test_two_gloo_processes_match_one_process(single, tmp_path):
    multi = tmp_path / "ddp"
    done = _torchrun(multi)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = sorted(s for s, k in _records(multi) if k == "train/loss")
    assert steps == list(range(STEPS))
    assert sorted(s for s, k in _records(multi) if k == "eval/loss_as_trained") == [0, 10, 20, STEPS]
    diff = largest_differences(single, multi)
    assert all(d < TOL for d in diff.values()), diff
    summary = json.loads((multi / "summary.json").read_text())
    assert summary["train/world_size"] == 2 and summary["run/status"] == "finished"
    assert json.loads((single / "summary.json").read_text())["train/world_size"] == 1
    assert done.stdout.count("[andrea-exp] finished") == 1  # only rank 0 reports


@needs_torchrun
def test_without_gradient_sync_the_comparison_fails(single, tmp_path):
    broken, script = tmp_path / "no-sync", tmp_path / "no_grad_sync.py"
    script.write_text(NO_GRAD_SYNC)
    done = _torchrun(broken, script=str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    diff = largest_differences(single, broken)
    # every quantity the DDP test compares misses by orders of magnitude, not by a hair
    assert all(d > 100 * TOL for d in diff.values()), diff


@needs_torchrun
def test_a_diverging_run_stops_every_process(tmp_path):
    run_dir = tmp_path / "diverge"
    done = _torchrun(run_dir, "train.lr=1e4", "train.grad_clip=0", "train.warmup_steps=0", "train.log_every=1",
                     timeout=180)  # a process left waiting on the other would hang until this kills it
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run/status"] == "diverged", summary
    assert summary["run/steps"] < STEPS
    assert done.stdout.count("[andrea-exp] diverged: ") == 1  # rank 0 reports; rank 1 stopped with it


def test_torchrun_without_run_dir_is_one_line_error(tmp_path):
    env = _env() | {"WORLD_SIZE": "2", "RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "andrea_exp", "train.max_steps=1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "hydra.run.dir" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists()
