"""The train/* rows (loss, gradient norm, lr, tokens, tokens/s, clip share, the output logits' log Z and
largest logit) of the steps since the last flush: each step's values stay on the device until `flush` reads
the whole window back with one host sync, since a sync every step would stall the GPU; a module of its own
so that the window's arithmetic (tokens counted, time spent aside on eval and checkpoints left out) is tested
alone."""

from __future__ import annotations

import contextlib
import time

import torch

from andrea_exp.runs import metric_keys as K


class LogWindow:
    """The steps since the last flush, values kept on the device; `flush` makes the train/* rows with one
    host sync. tokens/s counts the window's wall time less the work done `aside` (eval, checkpoints, maps)."""

    def __init__(self, tokens_per_step: int, grad_clip: float, clock=time.perf_counter, z_loss: float = 0.0):
        self.tokens_per_step, self.grad_clip, self.clock, self.z_loss = tokens_per_step, grad_clip, clock, z_loss
        self.restart()

    def restart(self) -> None:
        self.steps: list[tuple[int, torch.Tensor, torch.Tensor, float]] = []
        self.outputs: list[torch.Tensor] = []
        self.started, self.excluded = self.clock(), 0.0

    def add(self, step: int, loss: torch.Tensor, gn: torch.Tensor, lr: float,
            outputs: torch.Tensor | None = None) -> None:
        """outputs: the step's output-logit stats (model.chunked_loss.OUTPUT_STATS, (4,)), given for every
        step of a window or for none."""
        self.steps.append((step, loss, gn, lr))
        if outputs is not None:
            self.outputs.append(outputs)

    def __len__(self) -> int:
        return len(self.steps)

    @contextlib.contextmanager
    def aside(self):
        t0 = self.clock()
        try:
            yield
        finally:
            self.excluded += self.clock() - t0

    def flush(self) -> list[tuple[int, dict]]:
        """(step, row) for each step of the window, oldest first; the last row also has tokens/s and clip share."""
        if not self.steps:
            return []
        values = torch.stack([torch.stack([loss, gn]).float() for _, loss, gn, _ in self.steps])  # (steps, 2)
        if self.outputs:
            values = torch.cat([values, torch.stack(self.outputs).float()], dim=1)  # (steps, 2 + 4)
        values = values.tolist()  # the sync
        elapsed = self.clock() - self.started - self.excluded
        rows, clipped = [], 0
        for (at, _, _, lr), (loss, gn, *outputs) in zip(self.steps, values):
            clipped += self.grad_clip > 0 and gn > self.grad_clip
            rows.append((at, {K.TRAIN_LOSS: loss, K.GRAD_NORM: gn, K.TRAIN_LR: lr,
                              K.TRAIN_TOKENS: (at + 1) * self.tokens_per_step, **self.output_row(outputs)}))
        rows[-1][1].update({K.TRAIN_TOKENS_PER_S: self.tokens_per_step * len(rows) / max(elapsed, 1e-9),
                            K.TRAIN_GRAD_CLIP_FRAC: clipped / len(rows)})
        self.restart()
        return rows

    def output_row(self, outputs: list[float]) -> dict:
        """The train/out_* keys of one step's output-logit stats (none when the window has none)."""
        if not outputs:
            return {}
        logz_mean, logz_max, logit_max, logz_sq_mean = outputs
        row = {K.TRAIN_OUT_LOGZ_MEAN: logz_mean, K.TRAIN_OUT_LOGZ_MAX: logz_max, K.TRAIN_OUT_LOGIT_MAX: logit_max}
        return {**row, K.TRAIN_Z_LOSS: self.z_loss * logz_sq_mean} if self.z_loss else row
