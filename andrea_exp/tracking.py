"""One interface, two sinks: the run's metrics.jsonl always, and W&B unless disabled."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from omegaconf import OmegaConf


def _jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no nan/inf; keep them readable
    return value


class MetricsFile:
    """Append-only `metrics.jsonl`: one JSON object per line, each with `step`."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = path
        if resume_step is None:
            self.path.write_text("")
        else:
            self._truncate_after(resume_step)
        self._fh = open(self.path, "a", buffering=1)

    def _truncate_after(self, step: int) -> None:
        """Drop lines written after the checkpoint so a resumed run neither repeats nor skips a step."""
        if not self.path.exists():
            self.path.write_text("")
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if record.get("step", -1) < step:
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def write(self, metrics: dict, step: int) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._fh.close()


class Tracker:
    """Logs to metrics.jsonl and W&B; only the main process (rank 0) writes anything."""

    def __init__(self, run_dir: Path, cfg, *, enabled: bool = True, resume_step: int | None = None):
        self.run_dir, self.cfg, self.enabled = Path(run_dir), cfg, enabled
        self.metrics = MetricsFile(self.run_dir / "metrics.jsonl", resume_step) if enabled else None
        self.wandb_run = None

    def log(self, metrics: dict, step: int) -> None:
        if not self.enabled or not metrics:
            return
        self.metrics.write(metrics, step)
        if self.wandb_run is not None:
            self.wandb_run.log({**metrics, "train/step": step})

    def log_images(self, images: dict, step: int) -> None:
        """images: name -> PNG path, already written to the run directory."""

    def finish(self, summary: dict, failed: bool = False) -> None:
        """Write summary.json (with the resolved config) and close every sink."""
        if not self.enabled:
            return
        write_summary(self.run_dir, summary, self.cfg)
        self.metrics.close()


def write_summary(run_dir: Path, summary: dict, cfg) -> None:
    """summary.json at the top of the run directory, written atomically, with the resolved config."""
    summary = {k: _jsonable(v) for k, v in summary.items()}
    summary["config"] = OmegaConf.to_container(cfg, resolve=True)
    tmp = Path(run_dir) / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, Path(run_dir) / "summary.json")
