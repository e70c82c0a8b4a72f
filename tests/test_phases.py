"""PhaseClock: each phase's seconds, and the steps as the loop less its phases, on a clock driven by hand."""

from __future__ import annotations

import pytest
import torch

from andrea_exp.training.phases import PhaseClock


class HandClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_phases_and_steps_add_up_to_the_loop():
    hand = HandClock()
    clock = PhaseClock(torch.device("cpu"), clock=hand)
    hand.now = 2.0
    clock.loop_start()  # set-up took 2 s
    hand.now = 5.0  # 3 s of steps
    with clock.phase("probes"):
        hand.now = 5.5
    with clock.phase("evals"):
        hand.now = 6.5
    with clock.phase("probes"):
        hand.now = 7.0
    hand.now = 10.0  # 3 s more of steps
    clock.loop_end()
    with clock.phase("end"):  # after the loop: not part of it
        hand.now = 14.0
    got = clock.summary()
    assert got["run/time/setup_s"] == 2.0
    assert got["run/time/probes_s"] == 1.0
    assert got["run/time/evals_s"] == 1.0
    assert got["run/time/maps_s"] == 0.0 and got["run/time/checkpoints_s"] == 0.0
    assert got["run/time/steps_s"] == 6.0
    assert got["run/time/end_s"] == 4.0


def test_a_phase_that_raises_still_counts_and_unknown_phases_are_refused():
    hand = HandClock()
    clock = PhaseClock(torch.device("cpu"), clock=hand)
    clock.loop_start()
    with pytest.raises(RuntimeError), clock.phase("checkpoints"):
        hand.now = 1.5
        raise RuntimeError("disk full")
    assert clock.seconds["checkpoints"] == 1.5
    with pytest.raises(ValueError, match="unknown phase 'eval'; one of probes, evals"), clock.phase("eval"):
        pass
