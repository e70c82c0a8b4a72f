"""Cells that share a GPU share its memory (hydra/launcher=local_gpus with cells_per_gpu > 1): a cell starts on
its GPU only once it fits beside the cells running there; until then its worker waits, holding its slot.

Each cell on a shared GPU keeps a record in the sweep directory (`RECORDS`, one JSON file per cell): its GPU,
its worker's PID, whether it runs, and its peak, the most its process's caching allocator has reserved
(torch.cuda.max_memory_reserved). A thread of the worker updates the peak while the cell trains and marks it
measured once the cell's first steps are logged (a `train/loss` record in metrics.jsonl: by then its first
evaluation, forward and backward and its optimizer state have been allocated). A new cell's need is the
largest peak measured in the sweep (cells of one sweep are alike; the largest is the safe guess), and a cell
beside it still in its first steps counts with that need too. Until a first cell of the sweep is measured, a
cell starts only alone on its GPU. Then it waits while its need and a margin do not fit the room left: the
device's memory less the peaks of the cells beside it, and never more than the device says is free
(torch.cuda.mem_get_info, which sees every process). The decision itself is `room_for`, free of torch; a
lock per GPU makes deciding and recording the new cell one step, so two waiting cells never take the same
room.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

RECORDS = Path(".gpu_slots") / "memory"  # in the sweep directory
MARGIN_FRACTION = 0.05  # of the device, kept free: CUDA contexts (not in the allocator's peak) and fragmentation
POLL_S = 1.0
GB = 1e9


@dataclass(frozen=True)
class Decision:
    start: bool
    why: str  # one phrase for the worker's log


def room_for(total: int, free: int, beside: list[int | None], need: int | None,
             margin_fraction: float = MARGIN_FRACTION) -> Decision:
    """May a cell that needs `need` bytes (None: no cell of the sweep measured yet) start on a GPU of `total`
    bytes, `free` of them free now, beside running cells whose peaks are `beside` (None: a cell still in its
    first steps, counted as needing `need` too)?"""
    if not beside:
        return Decision(True, "alone on the GPU")
    if need is None:
        return Decision(False, "a cell beside it is in its first steps, and no cell of the sweep is measured yet")
    beside = [need if peak is None else peak for peak in beside]
    room = min(total - sum(beside), free)
    margin = int(margin_fraction * total)
    fits = need + margin <= room
    words = (f"needs ~{need / GB:.1f} GB + {margin / GB:.1f} GB margin; {max(room, 0) / GB:.1f} GB left beside "
             f"{len(beside)} running cell(s) using {sum(beside) / GB:.1f} GB")
    return Decision(fits, words)


# ---------------------------------------------------------------- the sweep's records


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def records(sweep_dir: Path) -> dict[str, dict]:
    """Every cell's record in the sweep, by file name."""
    folder = Path(sweep_dir) / RECORDS
    found = {p.name: _read(p) for p in folder.glob("cell*.json")} if folder.is_dir() else {}
    return {name: rec for name, rec in found.items() if rec is not None}


def beside_and_need(sweep_dir: Path, gpu: str, me: str) -> tuple[list[int | None], int | None]:
    """The peaks of the other cells running on `gpu` (their worker alive) and the largest peak measured in the
    sweep, running or ended."""
    recs = records(sweep_dir)
    beside = [r.get("peak") if r.get("measured") else None for name, r in recs.items()
              if name != me and r.get("gpu") == gpu and r.get("running") and _alive(r.get("pid"))]
    measured = [r["peak"] for r in recs.values() if r.get("measured") and r.get("peak")]
    return beside, max(measured, default=None)


def write_record(path: Path, **record) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)  # a reader never sees half a record


@contextlib.contextmanager
def _gpu_lock(sweep_dir: Path, gpu: str):
    folder = Path(sweep_dir) / RECORDS
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"gpu{gpu}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def wait_for_room(sweep_dir: Path, gpu: str, cell: int, memory, stop_asked, log=print,
                  poll_s: float = POLL_S) -> bool:
    """Wait until cell `cell` fits on `gpu`, then record it as running (not yet measured) and return True; False
    as soon as `stop_asked()` says the sweep was stopped. `memory()` gives the device's (free, total) bytes."""
    me, said = f"cell{cell}.json", None
    while True:
        with _gpu_lock(sweep_dir, gpu):
            beside, need = beside_and_need(sweep_dir, gpu, me)
            free, total = memory()
            decision = room_for(total, free, beside, need)
            if decision.start:
                write_record(Path(sweep_dir) / RECORDS / me, gpu=gpu, pid=os.getpid(), running=True, peak=None,
                             measured=False)
                if said is not None:
                    log(f"[andrea-exp] cell {cell} starts on GPU {gpu}: {decision.why}")
                return True
        if decision.why != said:
            log(f"[andrea-exp] cell {cell} waits for room on GPU {gpu}: {decision.why}")
            said = decision.why
        if stop_asked():
            return False
        time.sleep(poll_s)


def has_trained(run_dir: Path) -> bool:
    """The cell logged its first steps (a train/loss record in metrics.jsonl)."""
    try:
        with open(Path(run_dir) / "metrics.jsonl") as fh:
            return any('"train/loss"' in line for line in fh)
    except OSError:
        return False


class PeakRecorder:
    """While a cell trains: its record's peak, from `peak()` (bytes), every poll_s; measured once `trained()`."""

    def __init__(self, path: Path, gpu: str, peak, trained, poll_s: float = POLL_S):
        self.path, self.gpu, self.peak, self.trained, self.poll_s = path, gpu, peak, trained, poll_s
        self.measured = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="andrea-exp-gpu-memory", daemon=True)

    def __enter__(self) -> PeakRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.write(running=False, measured=True)  # the whole cell's peak: the estimate for cells to come

    def write(self, running: bool, measured: bool) -> None:
        write_record(self.path, gpu=self.gpu, pid=os.getpid(), running=running, peak=int(self.peak()),
                     measured=measured)

    def _run(self) -> None:
        while not self._done.wait(self.poll_s):
            self.measured = self.measured or self.trained()
            with contextlib.suppress(OSError):
                self.write(running=True, measured=self.measured)


# ---------------------------------------------------------------- the worker's side (imports torch)


@contextlib.contextmanager
def shared_gpu(sweep_dir: Path, gpu: str, device: str, cell: int, run_dir: Path, stop_asked):
    """Around a cell on a shared GPU: wait for room (yields False when the sweep was stopped meanwhile: the
    cell is not started), then record the cell's peak while it runs."""
    import torch

    index = torch.device(device).index or 0
    torch.cuda.init()  # the allocator's statistics exist only once CUDA has started: a new worker's has not
    torch.cuda.empty_cache()  # the worker's previous cell's cached blocks are not this cell's
    torch.cuda.reset_peak_memory_stats(index)
    if not wait_for_room(sweep_dir, gpu, cell, lambda: torch.cuda.mem_get_info(index), stop_asked):
        yield False
        return
    with PeakRecorder(Path(sweep_dir) / RECORDS / f"cell{cell}.json", gpu,
                      lambda: torch.cuda.max_memory_reserved(index), lambda: has_trained(run_dir)):
        yield True
