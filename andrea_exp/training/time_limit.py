"""A SLURM job's warning before its time limit, taken as a request to stop after the current step.

submitit asks SLURM for a signal (SIGUSR2 unless SUBMITIT_PREEMPT_SIGNAL names another) `signal_delay_s`
before the time limit, and on a preemption. Its own handler checkpoints the job by requeueing it at once,
wherever the signal lands: inside a training step, or inside W&B's start-up, which swallows it. Instead the
cell takes the signal itself: the loop stops after its step with a checkpoint and a summary whose status
is `timeout`, W&B is finished, and only then is submitit's handler called to requeue the job
(`hand_back`). Free of torch: the signal is taken before the cell imports it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

TIMEOUT_STATUS = "timeout"  # run/status of a run stopped for its time limit (with a checkpoint)


def time_limit_signal() -> int:
    """The signal submitit asks SLURM to send before the time limit (its SUBMITIT_PREEMPT_SIGNAL, or USR2)."""
    return int(getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")))


class TimeLimit:
    """In a SLURM job: `take` before the cell starts; the loop reads `signum` (interrupts.StopRequest)."""

    def __init__(self):
        self.signum: int | None = None
        self._submitits = None  # the handler submitit installed: it requeues the job

    def take(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self.signum = None
            self._submitits = signal.signal(time_limit_signal(), self._handle)

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        interrupts = sys.modules.get("andrea_exp.training.interrupts")  # not imported yet: no loop to tell
        if interrupts is not None:
            interrupts.request_stop(signum)

    def ignore_from_now(self) -> None:
        """The cell's result is written: a time-limit signal from now on changes nothing. Ignored rather than
        handled, as Python puts back the default handler (which ends the process) while it exits, and the job
        would end FAILED after a finished run."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(time_limit_signal(), signal.SIG_IGN)

    def hand_back(self) -> None:
        """After the stop was written: submitit's handler requeues the job and exits, or raises its
        UncompletedJobError when no requeue is left (hydra.launcher.max_num_timeout)."""
        if callable(self._submitits):
            self._submitits(self.signum, None)


TIME_LIMIT = TimeLimit()


def status_of(signum: int | None) -> str:
    """The run's status after a stop by `signum`: `timeout` for the time-limit signal, else `interrupted`."""
    return TIMEOUT_STATUS if signum is not None and signum == TIME_LIMIT.signum else "interrupted"
