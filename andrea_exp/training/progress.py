"""What a person watching a run sees: a tqdm bar on a terminal or, where stderr is a file (SLURM, nohup),
a line every `train.progress_every` steps with the elapsed time and an ETA; a module of its own because it
is display only, reading the step count and the latest loss and never changing what is trained or recorded."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from andrea_exp.training.runtime import Runtime


class Progress:
    """A tqdm bar on a terminal; elsewhere (SLURM, nohup) a line every `train.progress_every` steps with an ETA."""

    def __init__(self, cfg, rt: Runtime, start: int):
        setting, self.total, self.start = cfg.train.progress, cfg.train.max_steps, start
        on_terminal = sys.stderr.isatty()
        bar = rt.is_main and (setting is True or (setting == "auto" and on_terminal))
        self.every = cfg.train.progress_every if rt.is_main and setting == "auto" and not on_terminal else 0
        self.bar = tqdm(total=self.total, initial=start, disable=not bar, desc="train", dynamic_ncols=True)
        self.started, self.next_line = time.perf_counter(), (start // self.every + 1) * self.every if self.every else 0

    def update(self) -> None:
        self.bar.update(1)

    def note(self, step: int, loss: float) -> None:
        """After a window is flushed: `step` updates done, `loss` the latest training loss."""
        self.bar.set_postfix(loss=f"{loss:.3f}")
        if self.every and step >= self.next_line:
            self.next_line = (step // self.every + 1) * self.every
            elapsed = time.perf_counter() - self.started
            eta = elapsed / max(step - self.start, 1) * (self.total - step)
            print(f"[andrea-exp] step {step}/{self.total} ({100 * step / self.total:.0f}%) loss {loss:.4f} "
                  f"elapsed {_clock(elapsed)} ETA {_clock(eta)}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
