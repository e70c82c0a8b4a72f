"""The first SIGINT / SIGTERM to a local sweep stops it cleanly: no cell loses its last checkpoint.

Under Hydra's joblib launcher the launching process hands cells to worker processes. Left alone, the first
Ctrl-C raises KeyboardInterrupt in the launching process, inside joblib, which then kills the workers while
they write their cells' last checkpoints. Instead the launching process takes the first signal itself: it
writes a marker into the sweep directory and goes on waiting for its workers. A running cell stops after
its step, as after any signal (its worker got the same signal from the terminal or, when the launching
process alone was signalled, reads the marker: `forward_to_running_cell`); a cell that has not started
reads the marker and is recorded as interrupted at step 0. The sweep then ends with its table and exits
128 + signal. A second signal gets the previous handler (Ctrl-C twice still kills).

Each joblib worker takes the first signal from its start too (`WORKER`, through launch/local_workers.py): a
signal to the whole process group reaches every worker, and one that is idle or still setting up its cell
would die of it, which makes joblib kill the others in the middle of their checkpoints.

Free of torch: the launching process never imports it.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path

from andrea_exp.training.signals import FirstSignal

MARKER = ".stop-requested"  # in the sweep directory; holds the signal's name


def is_local_launcher(launcher_cfg) -> bool:
    """Hydra's joblib launcher (conf/hydra/launcher/local_gpus.yaml): cells in worker processes here."""
    return "joblib" in str(launcher_cfg.get("_target_", ""))


def is_submitit_local(launcher_cfg) -> bool:
    """hydra/launcher=slurm_local: cells in processes of submitit's local executor, children of this one."""
    return str(launcher_cfg.get("_target_", "")).endswith(".SlurmLocalLauncher")


def runs_cells_here(launcher_cfg) -> bool:
    """Cells run on this machine, started by the launching process: Hydra's basic launcher (one after another,
    in the launching process itself), the joblib one or submitit's local one. SLURM's cells are jobs of their
    own."""
    return (is_local_launcher(launcher_cfg) or is_submitit_local(launcher_cfg)
            or str(launcher_cfg.get("_target_", "")).endswith(".BasicLauncher"))


def requested(sweep_dir: Path | str) -> int | None:
    """The signal that stopped this sweep, or None while it runs on."""
    try:
        name = (Path(sweep_dir) / MARKER).read_text().strip()
    except OSError:
        return None
    return int(getattr(signal.Signals, name, signal.SIGTERM))


class LauncherStop(FirstSignal):
    """In the launching process, for one sweep: `arm` before the cells start, `disarm` once they are done."""

    def __init__(self):
        super().__init__()
        self._sweep_dir: Path | None = None

    @property
    def armed(self) -> bool:
        """Between arm and disarm: a sweep of this process is running."""
        return self._sweep_dir is not None

    def stop_asked(self) -> int | None:
        """The signal that stopped the sweep running in this process, or None."""
        return self.signum if self.armed else None

    def arm(self, sweep_dir: Path | str) -> None:
        self.signum, self._sweep_dir = None, Path(sweep_dir)
        with contextlib.suppress(FileNotFoundError):
            (self._sweep_dir / MARKER).unlink()  # left by an earlier, stopped start of this sweep: resumed now
        self.take()

    def disarm(self) -> None:
        self.give_back()
        if self._sweep_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                (self._sweep_dir / MARKER).unlink()
        self._sweep_dir = None

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._sweep_dir is None:
            return
        self._sweep_dir.mkdir(parents=True, exist_ok=True)
        (self._sweep_dir / MARKER).write_text(name + "\n")
        print(f"[andrea-exp] {name}: the running cells stop after their step with a checkpoint, no new cell "
              "starts (a second signal kills them)", file=sys.stderr, flush=True)


LAUNCHER = LauncherStop()


class WorkerStop(FirstSignal):
    """In a local sweep's worker process, or a SLURM job's cell (launch/slurm.py), for its whole life: the first
    signal is kept (the cell it sets up next, or is setting up, stops at its first step) instead of ending the
    worker; a running cell's own StopRequest takes the signal first and passes it on here, so the second one
    kills in either case."""


WORKER = WorkerStop()


def take_signals_in_worker() -> None:
    """The initializer of every worker process of hydra/launcher=local_gpus (launch/local_workers.py)."""
    WORKER.take()


def forward_to_running_cell(sweep_dir: Path | str | None) -> None:
    """In a worker: if the sweep was stopped and the running cell has not been asked to stop, ask it.

    Called from a helper thread, so it sets the cell's stop request directly (a signal sent to the process
    here could arrive as the cell's second one, which kills)."""
    if sweep_dir is None:
        return
    interrupts = sys.modules.get("andrea_exp.training.interrupts")  # not imported yet: no cell is training
    if interrupts is None:
        return
    signum = requested(sweep_dir)
    if signum is not None:
        interrupts.request_stop(signum)
