"""The first SIGINT / SIGTERM taken as a request, the handlers that were there before put back for the second
(Ctrl-C twice still kills). Shared by a run's stop request (interrupts.py) and a local sweep's (sweep_stop.py);
free of torch."""

from __future__ import annotations

import signal
import threading


class FirstSignal:
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def take(self) -> None:
        """From now on the first signal is ours (only the main thread may set handlers; elsewhere: none)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def give_back(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        outer = getattr(self._previous.get(signum), "__self__", None)
        self.give_back()
        self.on_signal(signum)
        # The handler taken over may be another FirstSignal's (a sweep's, running its cells in this process): the
        # first signal is its first too, so that the second reaches the handler before both, which kills.
        if isinstance(outer, FirstSignal) and outer.signum is None:
            outer._handle(signum, frame)

    def on_signal(self, signum: int) -> None:
        """What else the first signal does (nothing here)."""


class StartUpInterrupts:
    """SIGINTs that reach the command before its first training step. The command's entry installs `handle` for
    SIGINT (Python's own handler, plus a record): an interrupt raises KeyboardInterrupt as always, and one that a
    library swallowed while it loaded is still known when the first training loop begins, which then stops
    before its first step instead of training on."""

    def __init__(self):
        self.seen = 0

    def install(self) -> None:
        self.seen = 0  # a new command
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            signal.signal(signal.SIGINT, self.handle)

    def handle(self, signum, frame) -> None:
        self.seen += 1
        raise KeyboardInterrupt


START_UP = StartUpInterrupts()
