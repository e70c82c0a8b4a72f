"""Launchers: local_gpus (joblib, one GPU slot per worker) and slurm through submitit's local executor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import compose_config
from test_sweep import TINY, multirun, wandb_env
from test_tracking import read_run

from andrea_exp.launch.devices import claim_slot, gpu_for_slot, parallel_slots

SMALL = [o.replace("train.max_steps=20", "train.max_steps=10") for o in TINY]


def test_slots_go_round_the_gpus_with_cells_per_gpu_on_each():
    gpus = ["3", "5"]
    slots = [gpu_for_slot(s, gpus) for s in range(2 * 3)]  # 2 GPUs x cells_per_gpu=3
    assert slots == ["3", "5", "3", "5", "3", "5"]
    assert {g: slots.count(g) for g in gpus} == {"3": 3, "5": 3}


def test_a_held_slot_is_skipped_and_freed_when_its_worker_exits(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from andrea_exp.launch.devices import claim_slot; "
        f"slot, fh = claim_slot(Path({str(tmp_path)!r}), 2); print(slot, flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "0"
        slot, fh = claim_slot(tmp_path, 2)
        assert slot == 1  # slot 0 belongs to the other worker
        assert claim_slot(tmp_path, 2) is None  # every slot taken
        fh.close()
    finally:
        holder.kill()
        holder.wait()
    slot, fh = claim_slot(tmp_path, 2)
    assert slot == 0  # the dead worker's lock went with it
    fh.close()


def test_cells_per_gpu_must_be_a_positive_integer():
    with pytest.raises(ValueError, match=r"cells_per_gpu must be an integer >= 1; got 0"):
        parallel_slots(0)
    assert parallel_slots(2) == 2 * max(torch.cuda.device_count(), 1)


@pytest.mark.slow
def test_local_gpus_runs_cells_in_parallel_workers(tmp_path):
    proc, sweep_dir = multirun(tmp_path, "hydra/launcher=local_gpus", "cells_per_gpu=2", "model.d_k=8,16", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    n_gpus = max(torch.cuda.device_count(), 1)
    assert f"Joblib.Parallel(n_jobs={2 * n_gpus}" in proc.stdout + proc.stderr
    assert "2 cells, 0 failed" in proc.stdout
    runs = [read_run(next((sweep_dir / str(i) / "wandb").glob("offline-run-*"))) for i in range(2)]
    assert runs[0]["run"]["run_group"] != runs[1]["run"]["run_group"]  # two cells: two groups
    assert [r["run"]["display_name"].split()[0] for r in runs] == ["d_k=8", "d_k=16"]
    assert len(list((sweep_dir / "wandb").iterdir())) == 2  # both workers' runs linked into the sweep's folder
    assert all(r["state"] == "finished" for r in runs)


@pytest.mark.slow
def test_slurm_path_through_submitits_local_executor(tmp_path):
    # cell 1 fails when it runs: its checkpoints/ is taken by a file, so the final save raises
    blocked = tmp_path / "sweeps" / "grid" / "1" / "checkpoints"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a directory")
    proc, sweep_dir = multirun(tmp_path, "hydra/launcher=slurm_local", "model.d_k=8,16", *SMALL)
    assert proc.returncode == 1  # cell 1 failed; the exit code says so after both ran
    assert "2 cells, 1 failed" in proc.stdout and "cell 1 failed:" in proc.stdout
    assert json.loads((sweep_dir / "0" / "summary.json").read_text())["run/status"] == "finished"
    assert read_run(next((sweep_dir / "0" / "wandb").glob("offline-run-*")))["state"] == "finished"
    assert any(p.name.endswith("_log.out") for p in (sweep_dir / ".submitit").rglob("*"))  # submitit ran it


@pytest.mark.slow
@pytest.mark.parametrize("signum, whole_group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_slurm_local_stops_its_cells_after_their_step_and_ends_with_the_table(tmp_path, signum, whole_group):
    # Ctrl-C in a terminal reaches the whole process group; a kill of the command reaches the launcher alone
    sweep_dir = tmp_path / "sweeps" / "grid"
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", "-m", "hydra/launcher=slurm_local",
                             "train.max_steps=10,200000", *SMALL[1:], f"hydra.sweep.dir={sweep_dir}"],
                            cwd=tmp_path, env=wandb_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    until = time.monotonic() + 300
    while not ((sweep_dir / "1" / "metrics.jsonl").is_file() and (sweep_dir / "0" / "summary.json").is_file()):
        assert proc.poll() is None and time.monotonic() < until, proc.communicate()
        time.sleep(0.2)
    if whole_group:
        os.killpg(proc.pid, signum)
    else:
        proc.send_signal(signum)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signum, out[-3000:] + err[-3000:]
    assert "Traceback" not in out + err
    statuses = [json.loads((sweep_dir / c / "summary.json").read_text())["run/status"] for c in ("0", "1")]
    assert statuses == ["finished", "interrupted"]
    assert (sweep_dir / "1" / "checkpoints" / "latest.pt").is_file()
    assert "2 cells, 0 failed" in out
    assert f"sweep stopped by {signal.Signals(signum).name}; resume it with: andrea-exp -m hydra/launcher=slurm_local" \
        in out
    assert not (sweep_dir / ".submitit" / "%j").exists()


def test_slurm_preset_has_the_cluster_fields():
    cfg = compose_config("hydra/launcher=slurm", "hydra.launcher.partition=gpu", hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.partition, launcher.gpus_per_node, launcher.timeout_min) == ("gpu", 1, 240)
    assert (launcher.array_parallelism, launcher.cpus_per_task, launcher.mem_gb) == (16, 8, 64)


@pytest.mark.gpu
@pytest.mark.slow
def test_each_parallel_cell_sees_only_its_own_gpu(tmp_path):
    n = torch.cuda.device_count()
    cells = ",".join(str(8 * (i + 1)) for i in range(n))
    proc, sweep_dir = multirun(tmp_path, "hydra/launcher=local_gpus", f"model.d_k={cells}", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    gpus = sorted(line.rsplit("GPU ", 1)[1] for line in proc.stdout.splitlines() if ": slot " in line)
    assert gpus == sorted(str(i) for i in range(n))  # one worker per GPU, each pinned to a different one
    assert proc.stdout.count("on cuda:0") == n  # each cell sees its GPU as the only device
