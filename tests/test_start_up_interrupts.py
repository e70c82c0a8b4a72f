"""A Ctrl-C during start-up that a library swallows while it loads (a bare `except:` somewhere under an import)
still ends the command before its first training step: the entry's SIGINT handler records it, and the first
training loop reads the record."""

from __future__ import annotations

import os
import signal
import time

import pytest

from andrea_exp.launch.startup import start_up_guard
from andrea_exp.training import interrupts
from andrea_exp.training.signals import START_UP


@pytest.fixture
def fresh_process_state(monkeypatch):
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a new interpreter starts
    monkeypatch.setattr(interrupts, "loops_begun", 0)
    yield
    START_UP.seen = 0
    signal.signal(signal.SIGINT, previous)


def swallowed_interrupt() -> None:
    """SIGINT to this process, inside code that catches everything and goes on."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)  # the handler runs here and raises
    except BaseException:  # noqa: BLE001 (what the library does)
        pass


def test_a_swallowed_start_up_interrupt_stops_the_first_loop_before_its_first_step(fresh_process_state):
    with start_up_guard():
        swallowed_interrupt()
    with pytest.raises(KeyboardInterrupt):
        interrupts.StopRequest().__enter__()
    assert interrupts.loops_begun == 0  # so the command reports it as an interrupt during start-up, in one line


def test_without_an_interrupt_the_first_loop_begins(fresh_process_state):
    with start_up_guard():
        pass
    request = interrupts.StopRequest()
    request.__enter__()
    request.__exit__(None, None, None)
    assert interrupts.loops_begun == 1


def test_the_entry_keeps_python_s_behaviour_an_interrupt_raises(fresh_process_state):
    with start_up_guard():
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert START_UP.seen == 1
