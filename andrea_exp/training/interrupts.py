"""SIGINT and SIGTERM as a request to stop cleanly: `StopRequest` turns the first signal into a flag the
loop reads between steps (under DDP the processes agree at window flushes, so all stop at the same step)
and `Interrupted` carries the written summary and the shell's exit code (130 / 143) out of `train()`; a
module of its own because signal handlers are process-wide state with their own rules (main thread only,
restored on exit, a second signal kills)."""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

from andrea_exp.runs import metric_keys as K
from andrea_exp.training import sweep_stop
from andrea_exp.training.runtime import Runtime
from andrea_exp.training.signals import START_UP, FirstSignal
from andrea_exp.training.time_limit import TIME_LIMIT, TIMEOUT_STATUS, status_of


class Interrupted(Exception):
    """SIGINT / SIGTERM (or a SLURM job's time-limit signal) ended the run after a checkpoint and a summary
    were written."""

    STATUSES = ("interrupted", TIMEOUT_STATUS)  # the run/status of a run stopped this way

    def __init__(self, signum: int, summary: dict):
        how = "stopped for its time limit" if summary.get(K.RUN_STATUS) == TIMEOUT_STATUS else "interrupted"
        super().__init__(f"{how} by {signal.Signals(signum).name} at step {summary.get(K.RUN_STEPS)}")
        self.signum, self.summary = signum, summary
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports them


_active: StopRequest | None = None  # the running loop's request, for request_stop()
loops_begun = 0  # training loops this process has entered (a Ctrl-C outside them is start-up or an end)


def request_stop(signum: int) -> None:
    """Ask the running loop to stop as if `signum` had arrived (from a helper thread: sweep_stop)."""
    active = _active
    if active is not None and active.signum is None:
        active.signum = signum


class StopRequest(FirstSignal):
    """While active, SIGINT and SIGTERM only ask the loop to stop after the current step; a second signal
    gets the previous handler (Ctrl-C twice still kills a stuck run)."""

    status_of = staticmethod(status_of)  # the run's status after the stop: `interrupted`, or `timeout`

    def __enter__(self) -> StopRequest:
        global _active, loops_begun
        if loops_begun == 0 and START_UP.seen:  # a Ctrl-C during start-up that something swallowed: not trained
            START_UP.seen = 0
            raise KeyboardInterrupt
        loops_begun += 1
        # the sweep running here (or this sweep worker) was stopped, or the SLURM job's time is nearly up, during
        # this cell's set-up
        self.signum = sweep_stop.LAUNCHER.stop_asked() or sweep_stop.WORKER.signum or TIME_LIMIT.signum
        if self.signum is None:
            self.take()  # else the next signal is the second: it kills
        _active = self
        return self

    def __exit__(self, *exc) -> None:
        global _active
        _active = None
        self.give_back()

    def agreed(self, rt: Runtime, at_sync_point: bool) -> bool:
        """Stop now? Under DDP every process must stop at the same step: they agree at window flushes."""
        if rt.world_size == 1:
            return self.signum is not None
        if not at_sync_point:
            return False
        flag = torch.tensor([self.signum or 0], device=rt.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.signum = int(flag.item()) or None
        return self.signum is not None
