"""What a Ctrl-C does while the andrea-exp command starts (torch and Hydra loading, settings checked, before the
first training step): one line and status 130. A leaf: the command's entry (andrea_exp/__main__.py) loads the
Hydra app under `start_up_guard`, and the app (launch/cli.py) reports a later start-up interrupt the same way."""

import contextlib
import os
import signal
import sys

from andrea_exp.training.signals import START_UP

STARTUP = "interrupted by SIGINT during start-up, before the first training step; nothing was trained"


def interrupted_at_start_up() -> None:
    """One line and exit status 130, at once: nothing was written, and an interrupted import may have left the
    interpreter set to end by re-raising SIGINT at its finalisation (status -2, not 130)."""
    print(f"[andrea-exp] {STARTUP}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signal.SIGINT)


@contextlib.contextmanager
def start_up_guard():
    """An interrupt inside the block (the imports of torch and Hydra) ends the command as one line; from here on
    every SIGINT before the first training step is recorded (training.signals.START_UP), even one a library
    swallows while it loads."""
    START_UP.install()
    try:
        yield
    except KeyboardInterrupt:
        interrupted_at_start_up()
