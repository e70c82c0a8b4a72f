"""Where a run's wall time went: set-up, training steps, probes, evaluations, attention maps, checkpoints.

The GPU runs steps asynchronously, so a phase timed with the host clock alone would be charged with the
steps still queued before it. Each phase therefore waits for the device at its start (the queued steps
stay in "steps") and at its end. Probes, evaluations and checkpoints read their results back anyway,
so the waits add no stall of their own.
"""

from __future__ import annotations

import contextlib
import time

import torch

from andrea_exp.runs.metric_keys import LOOP_PHASES, RUN_TIME

PHASES = (*LOOP_PHASES, "end")


class PhaseClock:
    """Accumulated seconds per phase; `steps` is the loop's time less every phase inside it."""

    def __init__(self, device: torch.device, clock=time.perf_counter):
        self.clock = clock
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.created = clock()
        self.setup_s: float | None = None
        self.loop_started: float | None = None
        self.loop_s = 0.0

    def loop_start(self) -> None:
        self.loop_started = self.clock()
        self.setup_s = self.loop_started - self.created

    def loop_end(self) -> None:
        """Called on every way out of the loop: an error the device reports here is left to the code after it,
        so it never hides the exception that ended the loop."""
        with contextlib.suppress(RuntimeError):
            self.sync()
        self.loop_s = self.clock() - self.loop_started

    @contextlib.contextmanager
    def phase(self, name: str):
        if name not in self.seconds:
            raise ValueError(f"unknown phase {name!r}; one of {', '.join(PHASES)}")
        self.sync()
        t0 = self.clock()
        try:
            yield
        finally:
            self.sync()
            self.seconds[name] += self.clock() - t0

    def summary(self) -> dict:
        """run/time/* in seconds: setup, steps (the loop less its phases), then each phase."""
        inside = sum(self.seconds[k] for k in LOOP_PHASES)
        return {RUN_TIME["setup"]: self.setup_s, RUN_TIME["steps"]: max(self.loop_s - inside, 0.0),
                **{RUN_TIME[k]: v for k, v in self.seconds.items()}}
