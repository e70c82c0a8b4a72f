"""Attention maps drawn off the training's critical path: a process of their own draws the PNGs.

The probe writes a step's patterns as an .npz beside the PNGs it asks for and hands them to `BackgroundDrawer`,
which passes the request to a drawing process (`python -m andrea_exp.instruments.map_worker`, numpy and
matplotlib only) over a pipe and returns at once; the training goes on while the process draws. `PendingMaps.wait`
(the tracker calls it when the run ends, before the W&B run closes) returns once every PNG asked for so far is
on disk, so the run directory and W&B end with the same PNGs as when they were drawn in the loop.

One drawing process serves every run of the training process (a sweep's cells one after another), started at
the first request; it ends when the pipe closes: at the process's exit or `close()`. It ignores SIGINT and
SIGTERM (the training process handles them, then still waits for its maps) and ends once its pipe is closed.
"""

from __future__ import annotations

import atexit
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

from andrea_exp.runs import timeline


class DrawingFailed(RuntimeError):
    """The drawing process reported an error or ended early."""


class BackgroundDrawer:
    def __init__(self):
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()
        self.syncs = 0

    def _process(self) -> subprocess.Popen:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, bufsize=1)
        return self.proc

    def submit(self, arrays: Path, maps: list[tuple[str, str, str]]) -> PendingMaps:
        """Ask for the PNGs of `arrays` (array name, PNG path, title); returns at once."""
        with self.lock:
            self._send({"arrays": str(arrays), "maps": [list(m) for m in maps]})
        return PendingMaps(self, {f"attn_map/{name}": Path(png) for name, png, _ in maps})

    def _send(self, message: dict) -> None:
        proc = self._process()
        try:
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise DrawingFailed(f"the attention maps' drawing process ended (exit {proc.poll()})") from err

    def wait(self) -> None:
        """Returns once every request so far is drawn; raises DrawingFailed with the process's errors."""
        with self.lock:
            if self.proc is None:
                return
            self.syncs += 1
            self._send({"sync": self.syncs})
            for line in self.proc.stdout:
                reply = json.loads(line)
                if reply.get("sync") == self.syncs:
                    if reply["errors"]:
                        raise DrawingFailed("; ".join(reply["errors"]))
                    return
            raise DrawingFailed(f"the attention maps' drawing process ended (exit {self.proc.wait()})")

    def close(self) -> None:
        with self.lock:
            proc, self.proc = self.proc, None
        if proc is not None:
            proc.stdin.close()
            proc.wait()
            proc.stdout.close()


class PendingMaps(dict):
    """name -> PNG path, the files being drawn; `wait()` returns the same mapping once they are on disk."""

    def __init__(self, drawer: BackgroundDrawer, images: dict[str, Path]):
        super().__init__(images)
        self.drawer = drawer

    def wait(self) -> dict[str, Path]:
        with timeline.span("maps_wait"):
            self.drawer.wait()
        return dict(self)


_shared: BackgroundDrawer | None = None


def shared() -> BackgroundDrawer:
    """This process's drawer (one drawing process for all its runs), closed at the process's exit."""
    global _shared
    if _shared is None:
        _shared = BackgroundDrawer()
        atexit.register(_shared.close)
    return _shared


def serve(requests, replies) -> None:
    """The drawing process: a request line draws one .npz's PNGs, a sync line answers with the errors since the
    last sync. Errors are reported, not raised: the process keeps serving the next run."""
    from andrea_exp.instruments.maps import draw_arrays

    errors: list[str] = []
    for line in requests:
        message = json.loads(line)
        if "sync" in message:
            replies.write(json.dumps({"sync": message["sync"], "errors": errors}) + "\n")
            replies.flush()
            errors = []
            continue
        try:
            with timeline.span("maps_draw", arrays=message["arrays"]):
                draw_arrays(Path(message["arrays"]), [tuple(m) for m in message["maps"]])
        except Exception as err:  # noqa: BLE001 (reported to the run at its next sync)
            errors.append(f"{message['arrays']}: {type(err).__name__}: {err}")


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the training process stops the run, then waits for its maps
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    serve(sys.stdin, sys.stdout)
