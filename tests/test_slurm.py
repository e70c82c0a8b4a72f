"""Sweeps through `hydra/launcher=slurm` against a real SLURM cluster (tests/slurm/start_cluster.sh starts a
single-node one; without it these tests skip with one line saying why): a normal sweep, a refused
partition, one cancelled cell of two, a time limit run to completion through requeues, Ctrl-C on the
launcher. No scheduler is mocked: sbatch, squeue, scancel and sacct are SLURM's own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_sweep import wandb_env
from test_tracking import read_run

pytestmark = pytest.mark.slurm

# one CPU and 1 GB per cell, no GPU: two cells fit the test cluster's node at once
CLUSTER = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
           "hydra.launcher.gpus_per_node=0", "hydra.launcher.timeout_min=5", "hydra.launcher.signal_delay_s=30"]
TINY = ["data.seq_len=32", "probe.every=0", "train.log_every=5", "data.train_sequences=512",
        "data.eval_sequences=32", "train.batch_size=8", "logger.mode=offline", "train.progress=false"]


def start(tmp_path: Path, *overrides: str, env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", "-m", *CLUSTER, *TINY, *overrides,
                             f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, env={**wandb_env(tmp_path), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, sweep_dir


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def array_id(proc: subprocess.Popen, seen: list[str]) -> str:
    """Read the launcher's output up to its 'submitted SLURM array N' line; N."""
    for line in proc.stdout:
        seen.append(line)
        if "submitted SLURM array" in line:
            return line.split("submitted SLURM array ")[1].split()[0]
    raise AssertionError("no array submitted:\n" + "".join(seen) + proc.stderr.read())


def wait_until(check, timeout: float = 120, what: str = "") -> None:
    until = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < until, f"gave up waiting for {what}"
        time.sleep(0.5)


def summary(cell: Path) -> dict:
    return json.loads((cell / "summary.json").read_text())


def steps_in(cell: Path) -> list[int]:
    rows = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "train/loss" in r]


def sacct(job: str, fields: str) -> list[str]:
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", fields], capture_output=True, text=True,
                         check=True).stdout
    return out.splitlines()


def test_a_sweep_runs_as_one_array_and_ends_with_each_cells_slurm_state(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8,16", "train.max_steps=20", "name=tiny_grid")
    rc, out, err = finish(proc)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "SLURM state" in out and "2 COMPLETED" in out and "2 cells, 0 failed" in out
    assert "Traceback" not in out + err
    for cell in ("0", "1"):
        assert summary(sweep_dir / cell)["run/status"] == "finished"
        assert steps_in(sweep_dir / cell) == list(range(20))
    array = out.split("submitted SLURM array ")[1].split()[0]
    assert {line.split("|")[1] for line in sacct(array, "JobID,JobName")} == {"tiny_grid"}  # named for the study
    assert not (sweep_dir / ".submitit" / "%j").exists()
    logs = sorted(p.name for p in (sweep_dir / ".submitit").glob("*_log.out"))
    assert logs == [f"{array}_0_0_log.out", f"{array}_1_0_log.out"]  # where the table says they are
    assert "torch threads 1" in (sweep_dir / ".submitit" / logs[0]).read_text()  # capped to the job's one CPU


def test_a_cluster_without_accounting_is_said_once_and_the_launcher_still_returns(tmp_path):
    # the same controller, seen through a slurm.conf without accounting: sacct refuses, squeue answers
    conf = tmp_path / "slurm.conf"
    conf.write_text(Path("/etc/slurm/slurm.conf").read_text().replace(
        "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageType=accounting_storage/none"))
    assert subprocess.run(["sacct"], env={**wandb_env(tmp_path), "SLURM_CONF": str(conf)}).returncode != 0
    proc, sweep_dir = start(tmp_path, "model.d_k=8", "train.max_steps=20", env={"SLURM_CONF": str(conf)})
    rc, out, err = finish(proc)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert out.count("keeps no job accounting") == 1
    assert "1 unknown" in out and "1 cells, 0 failed" in out
    assert summary(sweep_dir / "0")["run/status"] == "finished"


def test_a_partition_the_cluster_lacks_is_refused_in_one_line_before_anything_is_submitted(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8,16", "train.max_steps=20", "hydra.launcher.partition=nope")
    rc, out, err = finish(proc, timeout=120)
    assert rc == 2
    assert err.strip().splitlines() == [
        "error: hydra.launcher.partition=nope: no such partition on this cluster (it has: debug)"]
    assert not (sweep_dir / ".submitit").exists()


def test_sbatchs_own_refusal_is_one_line_naming_the_setting(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8", "train.max_steps=20", "hydra.launcher.constraint=nope")
    rc, out, err = finish(proc, timeout=120)
    assert rc == 2
    assert err.strip().splitlines() == ["error: sbatch refused the sweep (hydra.launcher.constraint=nope): "
                                        "Invalid feature specification"]


def test_a_cancelled_cell_costs_only_itself(tmp_path):
    proc, sweep_dir = start(tmp_path, "train.max_steps=20,200000", "train.ckpt_every=0")
    seen: list[str] = []
    array = array_id(proc, seen)
    # a logged step, not just metrics.jsonl (made before W&B starts): the cancel lands in training
    wait_until(lambda: (sweep_dir / "1" / "metrics.jsonl").is_file() and steps_in(sweep_dir / "1"),
               what="cell 1 to train")
    wait_until(lambda: (sweep_dir / "0" / "summary.json").is_file(), what="cell 0 to finish")
    subprocess.run(["scancel", f"{array}_1"], check=True)
    rc, out, err = finish(proc)
    out = "".join(seen) + out
    assert rc == 1, out[-3000:] + err[-3000:]
    assert "Traceback" not in out + err
    assert "1 COMPLETED, 1 CANCELLED" in out, out
    assert summary(sweep_dir / "0")["run/status"] == "finished"
    stopped = summary(sweep_dir / "1")
    assert stopped["run/status"] == "interrupted" and stopped["run/steps"] > 0
    assert (sweep_dir / "1" / "checkpoints" / "latest.pt").is_file()  # stopped after its step, with a checkpoint
    # scancel signals W&B's service process too: the run is still closed with its status and last step
    wandb_run = read_run(sorted((sweep_dir / "1" / "wandb").glob("offline-run-*"))[-1])
    assert (wandb_run["state"], wandb_run["summary"]["run/status"]) == ("finished", "interrupted")
    assert wandb_run["summary"]["run/steps"] == stopped["run/steps"]
    job_err = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob(f"{array}_1_*.err"))
    assert "W&B's service process ended" in job_err and "Traceback" not in job_err, job_err[-3000:]
    resume = [line for line in out.splitlines() if "resume them with:" in line]
    assert len(resume) == 1 and "hydra/launcher=slurm" in resume[0] and f"hydra.sweep.dir={sweep_dir}" in resume[0]


def steps_per_second(tmp_path: Path) -> float:
    """This machine's training speed for the cells' settings on one CPU, from a short run outside SLURM."""
    run = tmp_path / "speed"
    settings = [o for o in TINY if not o.startswith("logger.")]
    subprocess.run([sys.executable, "-m", "andrea_exp", *settings, "train.max_steps=300", "logger.mode=disabled",
                    f"hydra.run.dir={run}"], env={**wandb_env(tmp_path), "OMP_NUM_THREADS": "1"},
                   capture_output=True, check=True)
    return summary(run)["run/steps"] / summary(run)["run/time/steps_s"]


@pytest.mark.slow
def test_a_time_limit_checkpoints_and_requeues_until_the_run_finishes(tmp_path):
    # A one-minute limit with the signal 20 s before it. SLURM checks time limits every 30 s and sends the
    # signal at the first check that is within 20 s + 30 s of the limit: 10 to 40 s into each job, so a job
    # trains for at most ~40 s. The run needs ~90 s of training here (measured first, as machines differ; a
    # measurement taken while other tests load the CPU can be 2x off, so at least ~45 s), so it stops for its
    # time limit at least once: after its step, with a checkpoint; submitit requeues the job, and the requeued
    # job continues its own cell.
    steps = int(90 * steps_per_second(tmp_path))
    proc, sweep_dir = start(tmp_path, f"train.max_steps={steps}", "hydra.launcher.timeout_min=1",
                            "hydra.launcher.signal_delay_s=20", "hydra.launcher.max_num_timeout=30")
    rc, out, err = finish(proc, timeout=900)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "Traceback" not in out + err
    assert "1 COMPLETED" in out  # not FAILED by a time-limit signal that came once the run had finished
    cell = sweep_dir / "0"
    assert summary(cell)["run/status"] == "finished"
    assert summary(cell)["run/steps"] == steps
    assert steps_in(cell) == list(range(steps))  # every step once: none lost, none repeated
    log = next((sweep_dir / ".submitit").glob("*_0_log.out")).read_text()
    stops = log.count("cell 0 stopped for its time limit")
    assert stops >= 1 and log.count("continues a run stopped for its time limit") == stops, log[-3000:]
    assert f"requeued job andrea:{out.split('submitted SLURM array ')[1].split()[0]} continues" in log


@pytest.mark.slow
def test_a_time_limit_with_no_requeue_left_ends_the_cell_timeout_with_its_checkpoint(tmp_path):
    proc, sweep_dir = start(tmp_path, "train.max_steps=200000", "hydra.launcher.timeout_min=1",
                            "hydra.launcher.signal_delay_s=20", "hydra.launcher.max_num_timeout=0")
    rc, out, err = finish(proc)
    assert rc == 1, out[-3000:] + err[-3000:]
    assert "Traceback" not in out + err
    stopped = summary(sweep_dir / "0")
    assert stopped["run/status"] == "timeout" and stopped["run/steps"] > 0
    assert (sweep_dir / "0" / "checkpoints" / "latest.pt").is_file()
    assert steps_in(sweep_dir / "0") == list(range(stopped["run/steps"]))
    assert "1 COMPLETED" in out  # it ended itself, before SLURM's limit
    resume = [line for line in out.splitlines() if "resume them with:" in line]
    assert len(resume) == 1 and f"train.resume=true hydra.sweep.dir={sweep_dir}" in resume[0]


def test_ctrl_c_on_the_launcher_says_what_runs_on_and_how_to_cancel_or_collect_it(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8,16", "train.max_steps=200000")
    seen: list[str] = []
    array = array_id(proc, seen)
    try:
        proc.send_signal(signal.SIGINT)
        rc, out, err = finish(proc, timeout=60)
        assert rc == 130
        assert "Traceback" not in out + err
        lines = err.strip().splitlines()
        assert f"2 job(s) of SLURM array {array} are still queued or running" in lines[0]
        assert f"scancel {array}" in err and f"andrea-exp-runs {sweep_dir}" in err
        assert f"hydra.sweep.dir={sweep_dir}" in err and "train.resume=true" in err
        assert subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True).stdout.strip()
    finally:
        subprocess.run(["scancel", array])


def test_ctrl_c_with_on_interrupt_cancel_cancels_the_jobs_and_each_cell_stops_with_a_checkpoint(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8,16", "train.max_steps=200000", "hydra.launcher.on_interrupt=cancel")
    seen: list[str] = []
    array = array_id(proc, seen)
    try:
        wait_until(lambda: all((sweep_dir / c / "metrics.jsonl").is_file() and steps_in(sweep_dir / c)
                               for c in ("0", "1")), what="both cells to train")
        proc.send_signal(signal.SIGINT)
        rc, out, err = finish(proc, timeout=120)
        out = "".join(seen) + out
        assert rc == 130, out[-3000:] + err[-3000:]
        assert "Traceback" not in out + err
        assert f"SIGINT: cancelling SLURM array {array} (2 job(s) queued or running" in err
        assert not subprocess.run(["squeue", "-h", "-j", array], capture_output=True, text=True).stdout.strip()
        assert "2 CANCELLED" in out
        for cell in ("0", "1"):
            stopped = summary(sweep_dir / cell)
            assert stopped["run/status"] == "interrupted" and stopped["run/steps"] > 0
            assert (sweep_dir / cell / "checkpoints" / "latest.pt").is_file()
            assert steps_in(sweep_dir / cell) == list(range(stopped["run/steps"]))
        resume = [line for line in out.splitlines() if "sweep stopped by SIGINT; resume it with:" in line]
        assert len(resume) == 1 and "hydra/launcher=slurm" in resume[0] and "train.resume=true" in resume[0]
    finally:
        subprocess.run(["scancel", array])


def test_an_unknown_on_interrupt_is_refused_in_one_line_before_anything_is_submitted(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8", "train.max_steps=20", "hydra.launcher.on_interrupt=stop")
    rc, out, err = finish(proc, timeout=120)
    assert rc == 2
    assert err.strip().splitlines() == ["error: hydra.launcher.on_interrupt must be one of keep, cancel; got 'stop'"]
    assert not (sweep_dir / ".submitit").exists()


def test_a_cell_cancelled_while_it_sets_up_stops_instead_of_training_on(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8", "train.max_steps=200000")
    seen: list[str] = []
    array = array_id(proc, seen)
    # the cell's set-up has begun (its first line), its training not yet: submitit's own handlers are in place
    wait_until(lambda: "torch threads 1" in job_log(sweep_dir, array), what="the cell to set up")
    assert not (sweep_dir / "0" / "metrics.jsonl").exists()
    subprocess.run(["scancel", array], check=True)
    rc, out, err = finish(proc, timeout=120)
    out = "".join(seen) + out
    assert rc == 1, out[-3000:] + err[-3000:]
    assert "1 CANCELLED" in out
    stopped = summary(sweep_dir / "0")
    assert stopped["run/status"] == "interrupted"
    if stopped["run/steps"]:  # the signal came once training had begun: after its step, with a checkpoint
        assert (sweep_dir / "0" / "checkpoints" / "latest.pt").is_file()
    else:
        assert stopped["run/error"] == "not started: its SLURM job was cancelled by SIGTERM"
    log = job_log(sweep_dir, array)
    assert "Bypassing signal SIGTERM" not in log and "Traceback" not in log, log[-3000:]


def job_log(sweep_dir: Path, array: str) -> str:
    """The stdout and stderr of the array's task 0 so far."""
    return "".join(p.read_text() for p in (sweep_dir / ".submitit").glob(f"{array}_0*_log.*"))


def test_a_cell_cancelled_as_its_job_starts_is_recorded_and_the_sweeps_resume_trains_it(tmp_path):
    proc, sweep_dir = start(tmp_path, "model.d_k=8", "train.max_steps=20")
    seen: list[str] = []
    array = array_id(proc, seen)
    wait_until(lambda: "RUNNING" in subprocess.run(["squeue", "-h", "-j", array, "-o", "%T"], capture_output=True,
                                                   text=True).stdout, what="the job to run")
    subprocess.run(["scancel", array], check=True)  # at once: the job is still starting Python
    rc, out, err = finish(proc, timeout=120)
    out = "".join(seen) + out
    assert rc == 1, out[-3000:] + err[-3000:]
    assert "1 CANCELLED" in out and "1 cells, 0 failed" in out
    stopped = summary(sweep_dir / "0")
    assert stopped["run/status"] == "interrupted"  # by the launcher, or by the cell itself had it begun
    resume = [line for line in out.splitlines() if "resume them with:" in line]
    assert len(resume) == 1
    command = resume[0].split("resume them with: andrea-exp ")[1].split()
    again = subprocess.run([sys.executable, "-m", "andrea_exp", *command], cwd=tmp_path, env=wandb_env(tmp_path),
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert summary(sweep_dir / "0")["run/status"] == "finished"
    assert steps_in(sweep_dir / "0") == list(range(20))
