"""Inside one cell's SLURM job (Hydra's submitit launcher): its time limit, its requeue, its CPUs.

A job that SLURM requeues (after its time limit through submitit, or a preemption) starts again with the
same overrides, into the same cell directory, which now holds the run it began. It continues that run
because the directory names this very job (`OWNER_FILE`, written when the job starts training): the array
task, on this cluster, started again (SLURM_RESTART_COUNT > 0). Any other command finds the run guarded
as before. Free of torch.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

OWNER_FILE = ".slurm-job"  # in the cell's directory: the SLURM job training it


def in_slurm_job() -> bool:
    """This process runs a cell as a SLURM job, through submitit."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and "SLURM_JOB_ID" in os.environ


def job_key() -> str:
    """The job as SLURM keeps it across requeues: cluster, array id and task (or the job id)."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    job = f"{array}_{task}" if array and task else os.environ["SLURM_JOB_ID"]
    return f"{os.environ.get('SLURM_CLUSTER_NAME', '')}:{job}"


def requeued_into(run_dir: Path) -> bool:
    """This job was requeued and `run_dir` holds the run it began before: continue it."""
    if not in_slurm_job() or int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0) < 1:
        return False
    try:
        return (Path(run_dir) / OWNER_FILE).read_text().strip() == job_key()
    except OSError:
        return False


def claim(run_dir: Path) -> None:
    """Mark `run_dir` as this job's, so that a requeue of this job continues it."""
    (Path(run_dir) / OWNER_FILE).write_text(job_key() + "\n")


def release(run_dir: Path) -> None:
    """The run is over: nothing left for a requeue to continue."""
    with contextlib.suppress(FileNotFoundError):
        (Path(run_dir) / OWNER_FILE).unlink()


def cap_threads() -> None:
    """Torch's threads to the job's CPUs: on a node that does not pin CPUs, a cell with one CPU that runs as
    many threads as the node has cores slows itself and its neighbours many times over."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus and cpus.isdigit():
        os.environ.setdefault("OMP_NUM_THREADS", cpus)  # before torch starts its pools
        import torch  # the cell imports it next anyway

        torch.set_num_threads(int(cpus))
        print(f"[andrea-exp] torch threads {cpus} (the job's CPUs, SLURM_CPUS_PER_TASK)", flush=True)
