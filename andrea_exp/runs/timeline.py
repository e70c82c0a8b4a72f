"""Where a command's seconds go: timed spans written as JSON lines when ANDREA_EXP_TIMELINE names a file.

Unset (the default) every call here returns at once. Set, each process of the command (the launching one, a
sweep's workers, the attention maps' drawing process) appends one line per span: its name, the process id, its
start and end as wall-clock seconds since the epoch (comparable across processes) and any fields given.
benchmarks/timeline.py turns these lines into a command's timeline; a leaf module, so that the command's first
lines can use it before anything heavy is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

ENV = "ANDREA_EXP_TIMELINE"


def enabled() -> bool:
    return bool(os.environ.get(ENV))


def record(name: str, start: float, end: float | None = None, **fields) -> None:
    """One span (or, with no end, one instant) of this process; appended whole in one write, so lines of
    processes writing at once never interleave."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"name": name, "pid": os.getpid(), "start": start, "end": start if end is None else end,
                       **fields}, default=str)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def mark(name: str, **fields) -> None:
    record(name, time.time(), **fields)


@contextlib.contextmanager
def span(name: str, **fields):
    """Records the block's wall-clock span, also when it raises."""
    if not enabled():
        yield
        return
    start = time.time()
    try:
        yield
    finally:
        record(name, start, time.time(), **fields)
