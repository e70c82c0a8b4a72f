"""A local sweep's worker process ends once the process that launched it has gone.

Hydra's joblib launcher keeps its worker processes for the next cell. A signal to the whole process group
(a scheduler's SIGTERM, `timeout`, `kill -- -PGID`) ends the launching process at once, while each worker
stops its cell cleanly (the step, a checkpoint, an `interrupted` summary) and then waits, idle, for a next
cell that never comes: loky ends an idle worker only after 300 s, holding its GPU memory and the command's
output pipe all that time. A daemon thread in each worker notices the new parent and ends the process as
soon as no cell is running; a running cell is left to finish or to stop on its own signal, so nothing it
writes is cut short. The same thread tells a running cell when its sweep was stopped (`sweep_stop`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path

from andrea_exp.training import sweep_stop

POLL_S = 0.5
_cell_running = threading.Event()
_watching = threading.Event()
_sweep_dir: Path | None = None


def follow_launcher(sweep_dir: Path | None = None, poll_s: float = POLL_S) -> None:
    """Start the watch (once per process): call it in a worker, whose parent is the launching process."""
    global _sweep_dir
    _sweep_dir = sweep_dir
    if _watching.is_set():
        return
    _watching.set()
    launcher = os.getppid()
    threading.Thread(target=_watch, args=(launcher, poll_s), name="andrea-exp-follow-launcher", daemon=True).start()


@contextlib.contextmanager
def cell_running():
    """Around a cell's training: the process is not ended while it runs."""
    _cell_running.set()
    try:
        yield
    finally:
        _cell_running.clear()


def _watch(launcher: int, poll_s: float) -> None:
    while os.getppid() == launcher or _cell_running.is_set():
        if _cell_running.is_set():
            sweep_stop.forward_to_running_cell(_sweep_dir)
        time.sleep(poll_s)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)  # nobody is left to read an exit code or a result
