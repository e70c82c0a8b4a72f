"""One GPU per parallel cell: which device a job of `hydra/launcher=local_gpus` may see.

joblib's loky workers are separate, long-lived processes that run one cell after another. A worker
claims one slot (a lock file in the sweep directory, held until the worker exits) and keeps the GPU of
that slot for its whole life, because CUDA reads CUDA_VISIBLE_DEVICES only once, when it starts.
With `cells_per_gpu` = k there are k slots per GPU, so at most k cells share a device.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

_parent_visible: list[str] | None = None  # the GPUs this worker was started with
_claimed: tuple[int, str, object, str] | None = None  # (slot, device index, open lock file, GPU id) of this worker


def visible_gpus() -> list[str]:
    """GPU ids this process may use, without initialising CUDA (it must start after the choice)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def parallel_slots(cells_per_gpu) -> int:
    """hydra.launcher.n_jobs of local_gpus: GPUs x cells_per_gpu (cells_per_gpu workers when there is no GPU)."""
    if isinstance(cells_per_gpu, bool) or not isinstance(cells_per_gpu, int) or cells_per_gpu < 1:
        raise ValueError(f"cells_per_gpu must be an integer >= 1; got {cells_per_gpu!r}")
    return max(len(visible_gpus()), 1) * cells_per_gpu


def claim_slot(lock_dir: Path, n_slots: int) -> tuple[int, object] | None:
    """The first free slot in 0..n_slots-1, locked until the returned file is closed (or the process exits)."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    for slot in range(n_slots):
        fh = open(lock_dir / f"slot{slot}.lock", "w")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        return slot, fh
    return None


def gpu_for_slot(slot: int, gpus: list[str]) -> str:
    """Slots go round the GPUs, so k x len(gpus) slots put exactly k on each GPU."""
    return gpus[slot % len(gpus)]


def _cuda_started() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def assign_device(cfg, sweep_dir: Path, job_num: int) -> str | None:
    """Pin this worker to one GPU; returns the device the job should use, or None to leave train.device as is."""
    global _parent_visible, _claimed
    if str(OmegaConf.select(cfg, "train.device", default="auto")) != "auto":
        return None  # the user chose a device
    if _parent_visible is None:
        _parent_visible = visible_gpus()
    if not _parent_visible:
        return None
    if _claimed is None:
        cells = OmegaConf.select(cfg, "cells_per_gpu", default=1)
        n_slots = len(_parent_visible) * max(int(cells), 1)
        got = claim_slot(Path(sweep_dir) / ".gpu_slots", n_slots)
        slot, fh = got if got is not None else (job_num % n_slots, None)
        gpu = gpu_for_slot(slot, _parent_visible)
        if _cuda_started():
            # CUDA already saw the parent's list: address the GPU by its position in it instead
            _claimed = (slot, str(_parent_visible.index(gpu)), fh, gpu)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            _claimed = (slot, "0", fh, gpu)
        print(f"[andrea-exp] worker {os.getpid()}: slot {slot}, GPU {gpu}", flush=True)
    return f"cuda:{_claimed[1]}"


def claimed_gpu() -> str | None:
    """The GPU (its id among the launcher's) this worker was pinned to, or None."""
    return None if _claimed is None else _claimed[3]


def register_resolver() -> None:
    """`${andrea_slots:${cells_per_gpu}}` in conf/hydra/launcher/local_gpus.yaml."""
    if not OmegaConf.has_resolver("andrea_slots"):
        OmegaConf.register_new_resolver("andrea_slots", parallel_slots, use_cache=True)
