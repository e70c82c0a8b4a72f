"""The run directory's files: their names, `metrics.jsonl` and `summary.json` writers and readers, the W&B id file.

Everything the training loop leaves on disk for the sweep table, the report and users' scripts goes
through here, so the file formats live in one place.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from omegaconf import OmegaConf

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
RUN_ID_FILE = "wandb_run_id"
CHECKPOINT_DIR = "checkpoints"
MAPS_DIR = "attention_maps"
HYDRA_DIR = ".hydra"
NON_FINITE = ("nan", "inf", "+inf", "-inf", "infinity", "-infinity")


def jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no nan/inf; keep them readable
    return value


def parse_number(value):
    """metrics.jsonl stores non-finite floats as strings; give them back as floats."""
    if isinstance(value, str) and value.strip().lower() in NON_FINITE:
        return float(value)
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
        record = {"step": step, **{k: jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._fh.close()


def read_metrics(run_dir: Path) -> list[dict]:
    """Every record of metrics.jsonl, non-finite values as floats; a line cut short by a kill is skipped."""
    path = Path(run_dir) / METRICS_FILE
    records = []
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        records.append({k: parse_number(v) for k, v in record.items()})
    return records


def write_summary(run_dir: Path, summary: dict, cfg) -> None:
    """summary.json at the top of the run directory, written atomically, with the resolved config."""
    summary = {k: jsonable(v) for k, v in summary.items()}
    summary["config"] = OmegaConf.to_container(cfg, resolve=True)
    tmp = Path(run_dir) / (SUMMARY_FILE + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, Path(run_dir) / SUMMARY_FILE)


def read_summary(run_dir: Path) -> dict:
    """summary.json of a run directory; a run that never wrote one reads as {"run/status": "missing"}."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.exists() else {"run/status": "missing"}
