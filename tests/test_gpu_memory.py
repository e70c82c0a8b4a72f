"""Cells that share a GPU share its memory: the start-or-wait rule (hand-computed cases), the sweep's records
it reads, the wait itself, the peak a running cell publishes, and on a GPU a cell that waits beside a
process holding most of the device's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from andrea_exp.launch import gpu_memory
from andrea_exp.launch.gpu_memory import RECORDS, room_for, wait_for_room

GB = 10**9


def test_a_cell_alone_on_its_gpu_starts_whatever_it_needs():
    assert room_for(total=80 * GB, free=1 * GB, beside=[], need=None).start
    assert room_for(total=80 * GB, free=1 * GB, beside=[], need=200 * GB).start  # alone it fails as it would alone


def test_before_any_cell_of_the_sweep_is_measured_a_cell_starts_only_alone():
    decision = room_for(total=141 * GB, free=140 * GB, beside=[None], need=None)
    assert not decision.start and "no cell of the sweep is measured yet" in decision.why


def test_a_cell_still_in_its_first_steps_counts_with_the_sweeps_estimate():
    # beside: 50 GB measured + one unmeasured counted as the need, 40 GB; room = min(141 - 90, 140) = 51 GB;
    # margin 7.05 GB: 40 + 7.05 <= 51 starts, 45 + 7.05 > 141 - 95 = 46 does not
    assert room_for(total=141 * GB, free=140 * GB, beside=[50 * GB, None], need=40 * GB).start
    assert not room_for(total=141 * GB, free=140 * GB, beside=[50 * GB, None], need=45 * GB).start


def test_two_80_gb_cells_do_not_share_a_141_gb_gpu_but_two_60_gb_ones_do():
    # margin 5% of 141 GB = 7.05 GB; room = min(141 - 80, 60) = 60 GB < 80 + 7.05
    no = room_for(total=141 * GB, free=60 * GB, beside=[80 * GB], need=80 * GB)
    assert not no.start
    assert no.why == "needs ~80.0 GB + 7.0 GB margin; 60.0 GB left beside 1 running cell(s) using 80.0 GB"
    # room = min(141 - 60, 80) = 80 >= 60 + 7.05
    assert room_for(total=141 * GB, free=80 * GB, beside=[60 * GB], need=60 * GB).start


def test_the_room_is_the_smaller_of_the_unused_peaks_and_what_the_device_says_is_free():
    # peaks leave 100 - 30 = 70 GB, but another process holds memory: only 20 GB free; margin 5 GB
    assert not room_for(total=100 * GB, free=20 * GB, beside=[30 * GB], need=16 * GB).start
    assert room_for(total=100 * GB, free=20 * GB, beside=[30 * GB], need=15 * GB).start  # 15 + 5 <= 20: exactly
    # a cell beside that freed part of its peak still counts with its peak: 100 - 90 = 10 GB left
    assert not room_for(total=100 * GB, free=60 * GB, beside=[90 * GB], need=6 * GB).start
    assert room_for(total=100 * GB, free=60 * GB, beside=[90 * GB], need=5 * GB).start


def write(sweep_dir, name, **record):
    folder = sweep_dir / RECORDS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(record))


def test_the_need_is_the_largest_peak_measured_in_the_sweep_and_only_live_running_cells_are_beside(tmp_path):
    alive, dead = os.getpid(), _dead_pid()
    write(tmp_path, "cell0.json", gpu="0", pid=alive, running=True, peak=30 * GB, measured=True)
    write(tmp_path, "cell1.json", gpu="0", pid=alive, running=True, peak=2 * GB, measured=False)
    write(tmp_path, "cell2.json", gpu="1", pid=alive, running=True, peak=50 * GB, measured=True)  # another GPU
    write(tmp_path, "cell3.json", gpu="0", pid=alive, running=False, peak=70 * GB, measured=True)  # ended
    write(tmp_path, "cell4.json", gpu="0", pid=dead, running=True, peak=9 * GB, measured=True)  # its worker died
    beside, need = gpu_memory.beside_and_need(tmp_path, "0", me="cell5.json")
    assert sorted(beside, key=lambda p: p or 0) == [None, 30 * GB]
    assert need == 70 * GB


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_waiting_cell_starts_once_the_cell_beside_it_ends_and_records_itself_running(tmp_path):
    write(tmp_path, "cell0.json", gpu="0", pid=os.getpid(), running=True, peak=80 * GB, measured=True)
    free = {"now": 55 * GB}
    lines: list[str] = []

    def end_cell0():
        time.sleep(0.3)
        write(tmp_path, "cell0.json", gpu="0", pid=os.getpid(), running=False, peak=80 * GB, measured=True)
        free["now"] = 135 * GB

    threading.Thread(target=end_cell0).start()
    started = wait_for_room(tmp_path, "0", 1, lambda: (free["now"], 141 * GB), stop_asked=lambda: None,
                            log=lines.append, poll_s=0.05)
    assert started
    assert lines == ["[andrea-exp] cell 1 waits for room on GPU 0: needs ~80.0 GB + 7.0 GB margin; 55.0 GB left "
                     "beside 1 running cell(s) using 80.0 GB",
                     "[andrea-exp] cell 1 starts on GPU 0: alone on the GPU"]
    mine = json.loads((tmp_path / RECORDS / "cell1.json").read_text())
    assert mine == {"gpu": "0", "pid": os.getpid(), "running": True, "peak": None, "measured": False}
    # the next cell counts this one, still in its first steps, with the sweep's largest peak (80 GB)
    assert gpu_memory.beside_and_need(tmp_path, "0", "cell2.json") == ([None], 80 * GB)


def test_a_stopped_sweep_ends_the_wait_without_starting_the_cell(tmp_path):
    write(tmp_path, "cell0.json", gpu="0", pid=os.getpid(), running=True, peak=None, measured=False)  # unmeasured
    started = wait_for_room(tmp_path, "0", 1, lambda: (100 * GB, 100 * GB), stop_asked=lambda: 2,
                            log=lambda line: None, poll_s=0.05)
    assert not started and not (tmp_path / RECORDS / "cell1.json").exists()


def test_a_running_cell_publishes_its_peak_measured_once_it_has_trained(tmp_path):
    path = tmp_path / "cell0.json"
    state = {"peak": 3 * GB, "trained": False}
    with gpu_memory.PeakRecorder(path, "0", lambda: state["peak"], lambda: state["trained"], poll_s=0.02):
        time.sleep(0.1)
        assert json.loads(path.read_text())["measured"] is False
        state["peak"], state["trained"] = 7 * GB, True
        time.sleep(0.1)
        assert json.loads(path.read_text()) == {"gpu": "0", "pid": os.getpid(), "running": True, "peak": 7 * GB,
                                                "measured": True}
    assert json.loads(path.read_text())["running"] is False


def test_a_cell_has_trained_once_metrics_jsonl_holds_a_train_record(tmp_path):
    assert not gpu_memory.has_trained(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/loss": 3.0}\n')
    assert not gpu_memory.has_trained(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/loss": 3.0}\n{"step": 4, "train/loss": 2.9}\n')
    assert gpu_memory.has_trained(tmp_path)


HOLD = """import sys, time, torch
free, total = torch.cuda.mem_get_info()
keep = torch.empty(int(free - 0.02 * total), dtype=torch.uint8, device="cuda")  # all but 2% of the device
print(torch.cuda.max_memory_reserved(), flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.mark.gpu
def test_on_a_gpu_a_cell_waits_beside_a_cell_that_holds_the_memory_and_starts_once_it_ends(tmp_path):
    """A real process holds all but 2% of GPU 0 for 20 s, recorded as a measured cell of the sweep; a tiny sweep
    cell on that GPU with cells_per_gpu=2 waits (the device's free memory is below its need) and trains after."""
    from conftest import REPO_ROOT, cli_env, tiny

    from andrea_exp.launch.devices import visible_gpus

    env = {**cli_env(), "CUDA_VISIBLE_DEVICES": visible_gpus()[0]}  # one GPU: the holder's and the cell's
    holder = subprocess.Popen([sys.executable, "-c", HOLD, "20"], stdout=subprocess.PIPE, text=True, env=env)
    peak = int(holder.stdout.readline())
    threading.Thread(target=holder.wait, daemon=True).start()  # reaped as it ends: a zombie's PID looks alive
    sweep = tmp_path / "sweep"
    write(sweep, "cell9.json", gpu=env["CUDA_VISIBLE_DEVICES"], pid=holder.pid, running=True, peak=peak,
          measured=True)
    begun = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "andrea_exp", "-m", *tiny("train.max_steps=5", "train.log_every=1"),
                           "hydra/launcher=local_gpus", "cells_per_gpu=2", "mps=false", "hydra.launcher.n_jobs=1",
                           f"hydra.sweep.dir={sweep}"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    gpu = env["CUDA_VISIBLE_DEVICES"]
    assert f"cell 0 waits for room on GPU {gpu}" in proc.stdout and f"cell 0 starts on GPU {gpu}" in proc.stdout
    assert time.monotonic() - begun >= 15  # it started after the holder let go
    assert json.loads((sweep / "0" / "summary.json").read_text())["run/status"] == "finished"
    assert json.loads((sweep / RECORDS / "cell0.json").read_text())["measured"] is True
