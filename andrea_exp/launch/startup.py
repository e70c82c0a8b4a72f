"""The andrea-exp command's start-up guard: the Hydra app (launch/cli.py) is imported inside a Ctrl-C guard, so
that an interrupt while torch and Hydra load ends in one line too."""

import os
import signal
import sys

STARTUP = "interrupted by SIGINT during start-up, before the first training step; nothing was trained"


def interrupted_at_start_up() -> None:
    """One line and exit status 130, at once: nothing was written, and an interrupted import may have left the
    interpreter set to end by re-raising SIGINT at its finalisation (status -2, not 130)."""
    print(f"[andrea-exp] {STARTUP}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signal.SIGINT)


def main() -> None:
    try:
        from andrea_exp.launch.cli import main as command
    except KeyboardInterrupt:
        interrupted_at_start_up()
    command()
