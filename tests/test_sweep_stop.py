"""The pieces of a clean sweep stop, by hand: the marker, the launching process's handler, the cell's request."""

from __future__ import annotations

import os
import signal

import pytest

from andrea_exp.training import interrupts, sweep_stop


def test_requested_reads_the_signal_from_the_marker(tmp_path):
    assert sweep_stop.requested(tmp_path) is None
    (tmp_path / sweep_stop.MARKER).write_text("SIGINT\n")
    assert sweep_stop.requested(tmp_path) == signal.SIGINT
    (tmp_path / sweep_stop.MARKER).write_text("SIGTERM\n")
    assert sweep_stop.requested(tmp_path) == signal.SIGTERM


def test_the_first_signal_writes_the_marker_and_the_second_gets_the_previous_handler(tmp_path):
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    stop = sweep_stop.LauncherStop()
    try:
        (tmp_path / sweep_stop.MARKER).write_text("SIGTERM\n")  # an earlier start's, stopped: cleared on arm
        stop.arm(tmp_path)
        assert sweep_stop.requested(tmp_path) is None and stop.signum is None
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signum == signal.SIGINT and sweep_stop.requested(tmp_path) == signal.SIGINT
        assert seen == []  # taken by the sweep, not passed on
        os.kill(os.getpid(), signal.SIGINT)
        assert seen == [signal.SIGINT]  # the second one reaches the handler that was there before
        stop.disarm()
        assert not (tmp_path / sweep_stop.MARKER).exists()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_is_local_launcher_names_the_joblib_launcher_only():
    joblib = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
    assert sweep_stop.is_local_launcher({"_target_": joblib})
    assert not sweep_stop.is_local_launcher({"_target_": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"})
    assert not sweep_stop.is_local_launcher({})


@pytest.mark.parametrize("marker", [None, "SIGTERM"])
def test_a_stopped_sweep_asks_the_running_loop_to_stop_once(tmp_path, marker):
    if marker:
        (tmp_path / sweep_stop.MARKER).write_text(marker)
    sweep_stop.forward_to_running_cell(tmp_path)  # no loop running: nothing to ask
    with interrupts.StopRequest() as stop:
        sweep_stop.forward_to_running_cell(tmp_path)
        assert stop.signum == (signal.SIGTERM if marker else None)
        (tmp_path / sweep_stop.MARKER).write_text("SIGINT")
        sweep_stop.forward_to_running_cell(tmp_path)
        assert stop.signum == (signal.SIGTERM if marker else signal.SIGINT)  # the first request stands
    assert interrupts._active is None
