"""SIGINT / SIGTERM to a real run: the step ends, a checkpoint and an `interrupted` summary are written, the
resume command is printed, the exit code is 128 + signal, and the printed command finishes the run."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tiny
from test_sweep import wandb_env
from test_tracking import read_run

from andrea_exp.training import checkpoint, sweep_stop

SMALL = tiny("data.train_sequences=200", "train.max_steps=200", "train.eval_every=0", "train.log_every=1",
             "train.sample_tokens=2")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "0", "WANDB_MODE": "disabled"}


def train_losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def wait_for_steps(proc: subprocess.Popen, run_dir: Path) -> None:
    """Until the run has logged a few training steps (it must not end before)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no training step logged in time"
        time.sleep(0.02)


def start_and_signal(run_dir: Path, signum: int) -> subprocess.CompletedProcess:
    """Start a run, send `signum` once a few steps are logged, and wait for it to end on its own."""
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", *SMALL, f"hydra.run.dir={run_dir}"], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_steps(proc, run_dir)
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_run_with_checkpoint_summary_and_resume_command(tmp_path, signum, code):
    run_dir = tmp_path / "run"
    done = start_and_signal(run_dir, signum)
    assert done.returncode == code, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = summary["run/steps"]
    assert summary["run/status"] == "interrupted" and 3 <= steps < 200
    assert checkpoint.load(run_dir / "checkpoints")["step"] == steps  # the checkpoint is at the last step taken
    assert sorted(train_losses(run_dir)) == list(range(steps))  # every step taken is logged, once
    lines = [line for line in done.stdout.splitlines() if "resume with:" in line]
    assert len(lines) == 1 and f"interrupted by {signal.Signals(signum).name} at step {steps}" in lines[0]
    assert lines[0].rstrip().endswith(f"train.resume=true hydra.run.dir={run_dir}")
    assert "Traceback" not in done.stderr


def test_the_printed_command_finishes_the_run_as_if_never_stopped(tmp_path):
    run_dir, unbroken = tmp_path / "run", tmp_path / "unbroken"
    done = start_and_signal(run_dir, signal.SIGINT)
    command = done.stdout.split("resume with: ", 1)[1].splitlines()[0]
    argv = shlex.split(command)
    assert argv[0] == "andrea-exp"
    resumed = subprocess.run([sys.executable, "-m", "andrea_exp", *argv[1:]], env=ENV, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["run/status"] == "finished"
    assert (run_dir / ".hydra" / "resume-1" / "overrides.yaml").is_file()  # the original .hydra/ kept as it was
    reference = subprocess.run([sys.executable, "-m", "andrea_exp", *SMALL, f"hydra.run.dir={unbroken}"], env=ENV,
                               capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert train_losses(run_dir) == train_losses(unbroken)  # bit for bit, every step once


def stop_default_sweep(sweep_dir: Path, signum: int, cells: str = "8,16,32", steps: int = 200):
    """A sweep on Hydra's default launcher (cells one after another in one process), signalled once cell 0 has
    logged a few steps; returns (return code, stdout, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", "-m", *SMALL, f"train.max_steps={steps}",
                             f"model.d_k={cells}", f"hydra.sweep.dir={sweep_dir}"], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics = sweep_dir / "0" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signum)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_default_sweep_lists_every_cell_and_prints_the_sweeps_resume_line(tmp_path, signum):
    """As a local sweep does: the running cell stops with a checkpoint, the cells not yet started are recorded
    as interrupted at step 0 (with their overrides), the table lists all of them, and the one resume line is
    the sweep's, not a cell's."""
    sweep_dir = tmp_path / "sweep"
    code, out, err = stop_default_sweep(sweep_dir, signum)
    assert code == 128 + signum, err[-3000:]
    assert json.loads((sweep_dir / "0" / "summary.json").read_text())["run/status"] == "interrupted"
    for cell, d_k in (("1", 16), ("2", 32)):
        late = json.loads((sweep_dir / cell / "summary.json").read_text())
        assert (late["run/status"], late["run/steps"]) == ("interrupted", 0)
        assert f"model.d_k={d_k}" in (sweep_dir / cell / ".hydra" / "overrides.yaml").read_text()
        assert not (sweep_dir / cell / "metrics.jsonl").exists()
    rows = {line.split()[0]: line for line in out.splitlines() if line[:1].isdigit()}
    assert set(rows) == {"0", "1", "2"} and all("interrupted" in row for row in rows.values()), out
    assert "model.d_k=32" in rows["2"] and "(defaults)" not in out
    assert "resume with:" not in out and out.count("resume it with: andrea-exp -m ") == 1
    assert "Traceback" not in err and not (sweep_dir / sweep_stop.MARKER).exists()


def test_the_default_sweeps_resume_line_finishes_every_cell(tmp_path):
    sweep_dir = tmp_path / "sweep"
    code, out, _ = stop_default_sweep(sweep_dir, signal.SIGINT, cells="8,16", steps=300)
    assert code == 130
    argv = shlex.split(out.split("resume it with: ", 1)[1].splitlines()[0])
    assert argv[-2:] == ["train.resume=true", f"hydra.sweep.dir={sweep_dir}"]
    stopped_at = json.loads((sweep_dir / "0" / "summary.json").read_text())["run/steps"]
    resumed = subprocess.run([sys.executable, "-m", "andrea_exp", *argv[1:]], env=ENV, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for cell in "01":
        summary = json.loads((sweep_dir / cell / "summary.json").read_text())
        assert (summary["run/status"], summary["run/steps"]) == ("finished", 300)
    assert f"resuming {sweep_dir / '0'} from step {stopped_at}" in resumed.stdout
    assert f"{sweep_dir / '1'} never started; starting it from step 0" in resumed.stdout


def session_processes(session: int) -> list[str]:
    return subprocess.run(["ps", "-s", str(session), "-o", "pid="], capture_output=True, text=True).stdout.split()


def start_local_sweep(tmp_path, cells: str, steps: int = 3000, per_gpu: int = 2) -> tuple[subprocess.Popen, Path]:
    """A local_gpus sweep, `per_gpu` cells at a time, in a session of its own; returns once cells 0 and 1 train."""
    sweep_dir = tmp_path / "sweep"
    log = (tmp_path / "sweep.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", "-m", *SMALL, f"train.max_steps={steps}",
                             f"model.d_k={cells}", "hydra/launcher=local_gpus", f"cells_per_gpu={per_gpu}",
                             f"hydra.sweep.dir={sweep_dir}"], env=ENV, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    metrics = [sweep_dir / cell / "metrics.jsonl" for cell in ("0", "1")]
    deadline = time.monotonic() + 120
    while not all(m.exists() and len(m.read_text().splitlines()) >= 3 for m in metrics):
        assert proc.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the cells logged no steps in time"
        time.sleep(0.05)
    return proc, sweep_dir


def wait_for_session_to_end(proc: subprocess.Popen) -> list[str]:
    """The processes of the sweep's session still alive 30 s after its launching process ended (killed then)."""
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = session_processes(proc.pid)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
    return left


def assert_stopped_cleanly(sweep_dir: Path, cell: str) -> None:
    summary = json.loads((sweep_dir / cell / "summary.json").read_text())
    assert summary["run/status"] == "interrupted" and 3 <= summary["run/steps"] < 3000
    assert (sweep_dir / cell / "checkpoints" / "latest.pt").is_file()
    assert not list((sweep_dir / cell / "checkpoints").glob("*.tmp"))  # no checkpoint cut short
    assert checkpoint.load(sweep_dir / cell / "checkpoints")["step"] == summary["run/steps"]


def signal_local_sweep_group(tmp_path, signum, cells: str, **start):
    """Signal a local sweep's whole process group; assert that no worker outlives it, that it exits 128 +
    signal and that cells 0 and 1 stopped cleanly; return the sweep dir and its log."""
    proc, sweep_dir = start_local_sweep(tmp_path, cells, **start)
    os.killpg(proc.pid, signum)
    assert wait_for_session_to_end(proc) == [], "worker processes outlived the sweep"
    log = (tmp_path / "sweep.log").read_text()
    assert proc.returncode == 128 + signum, log[-3000:]
    for cell in ("0", "1"):
        assert_stopped_cleanly(sweep_dir, cell)
    return sweep_dir, log


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process session with Linux ps")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_a_local_sweeps_group_stops_every_cell_cleanly_and_leaves_no_process(tmp_path, signum):
    """Ctrl-C in a terminal (SIGINT) or a scheduler, `timeout`, `kill -- -PGID` (SIGTERM) signal the whole
    process group: each running cell stops with a checkpoint and an `interrupted` summary, the cell not yet
    started is recorded as interrupted at step 0, the sweep prints its table and exits 128 + signal, and no
    worker is left waiting for loky's 300 s idle timeout."""
    sweep_dir, log = signal_local_sweep_group(tmp_path, signum, "8,16,32")
    late = json.loads((sweep_dir / "2" / "summary.json").read_text())
    assert late["run/status"] == "interrupted" and late["run/steps"] == 0
    assert late["run/error"] == f"not started: the sweep was stopped by {signal.Signals(signum).name}"
    assert not (sweep_dir / "2" / "metrics.jsonl").exists()
    assert "3 cells, 0 failed" in log and "Traceback" not in log and "KeyboardInterrupt" not in log
    assert log.count("resume it with: andrea-exp -m ") == 1
    assert not (sweep_dir / sweep_stop.MARKER).exists()


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process session with Linux ps")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_group_reaches_idle_workers_too_and_the_sweep_still_ends_with_its_table(tmp_path, signum):
    """More worker slots than cells (`cells_per_gpu=4` over two cells, as on a GPU machine with a small grid):
    the idle workers get the group's signal as well. They live on until the sweep ends, so joblib does not
    call its pool broken and kill the running cells before their checkpoints (TerminatedWorkerError)."""
    sweep_dir, log = signal_local_sweep_group(tmp_path, signum, "8,16", per_gpu=4)
    assert "Traceback" not in log and "TerminatedWorkerError" not in log, log[-3000:]
    assert "2 cells, 0 failed" in log and log.count("resume it with: andrea-exp -m ") == 1


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process session with Linux ps")
def test_the_printed_sweep_command_finishes_every_cell(tmp_path):
    """The line a stopped sweep prints is the whole command: run as printed, it resumes the stopped cells
    from their checkpoints and runs the one never started, with the sweep's own overrides."""
    proc, sweep_dir = start_local_sweep(tmp_path, "8,16,32", steps=1500)
    os.killpg(proc.pid, signal.SIGINT)
    wait_for_session_to_end(proc)
    log = (tmp_path / "sweep.log").read_text()
    command = log.split("resume it with: ", 1)[1].splitlines()[0]
    argv = shlex.split(command)
    assert argv[:2] == ["andrea-exp", "-m"] and "model.d_k=8,16,32" in argv and "cells_per_gpu=2" in argv
    assert argv[-2:] == ["train.resume=true", f"hydra.sweep.dir={sweep_dir}"]
    stopped_at = {cell: json.loads((sweep_dir / cell / "summary.json").read_text())["run/steps"] for cell in "01"}
    resumed = subprocess.run([sys.executable, "-m", "andrea_exp", *argv[1:]], env=ENV, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for cell in "012":
        summary = json.loads((sweep_dir / cell / "summary.json").read_text())
        assert (summary["run/status"], summary["run/steps"]) == ("finished", 1500)
    for cell, step in stopped_at.items():
        assert f"resuming {sweep_dir / cell} from step {step}" in resumed.stdout
    assert f"{sweep_dir / '2'} never started" in resumed.stdout


@pytest.mark.skipif(sys.platform != "linux", reason="reads the process session with Linux ps")
def test_a_signal_to_the_launching_process_alone_reaches_the_running_cells(tmp_path):
    """`kill PID` of the launching process: its workers get no signal, so it tells them through the sweep
    directory; they stop as cleanly as after a signal of their own."""
    proc, sweep_dir = start_local_sweep(tmp_path, "8,16")
    os.kill(proc.pid, signal.SIGTERM)
    assert wait_for_session_to_end(proc) == [], "worker processes outlived the sweep"
    assert proc.returncode == 143, (tmp_path / "sweep.log").read_text()[-3000:]
    for cell in ("0", "1"):
        assert_stopped_cleanly(sweep_dir, cell)


def children(pid: int) -> list[int]:
    return [int(p) for p in subprocess.run(["ps", "--ppid", str(pid), "-o", "pid="], capture_output=True,
                                           text=True).stdout.split()]


@pytest.mark.skipif(sys.platform != "linux", reason="finds the run's child processes with Linux ps")
def test_a_signal_to_every_process_of_a_run_still_closes_its_wandb_run_with_its_status_and_last_step(tmp_path):
    """SLURM's scancel signals every process of a job, W&B's service too (its own session does not shield it):
    the service ends at once. The run stops after its step as usual; its W&B run (offline, read back with W&B's
    own reader) is closed with the run's status and last step, and no exit hook prints a traceback."""
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", *SMALL, "train.max_steps=3000", "logger.mode=offline",
                             f"hydra.run.dir={run_dir}"], env=wandb_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_steps(proc, run_dir)
    job = [proc.pid, *children(proc.pid)]
    assert len(job) >= 2, "W&B's service process was not found"
    for pid in job:
        os.kill(pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "ConnectionResetError" not in err, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["run/status"] == "interrupted"
    wandb_run = read_run(sorted((run_dir / "wandb").glob("offline-run-*"))[-1])  # the run as W&B closed it
    assert (wandb_run["state"], wandb_run["exit_code"]) == ("finished", 0)
    assert wandb_run["summary"]["run/status"] == "interrupted"
    assert wandb_run["summary"]["run/steps"] == summary["run/steps"]
    assert "interrupted" in wandb_run["run"]["tags"]
    assert wandb_run["run"]["run_id"] == (run_dir / "wandb_run_id").read_text().strip()
