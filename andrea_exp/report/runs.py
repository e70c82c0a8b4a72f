"""Runs on disk -> Run objects: the resolved config (flattened), summary.json and metrics.jsonl of each run.

Reads only what the training loop writes (`.hydra/`, `metrics.jsonl`, `summary.json`, through
andrea_exp.runs.rundir); nothing here needs W&B.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from andrea_exp.config.choices import normalize_scale
from andrea_exp.runs import metric_keys as mk
from andrea_exp.runs.rundir import (
    CHECKPOINT_DIR,
    HYDRA_DIR,
    MAPS_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    flatten,
    parse_number,
    read_metrics,
    read_summary,
)

SKIP_DIRS = {"wandb", CHECKPOINT_DIR, MAPS_DIR, HYDRA_DIR}  # never hold a run of their own


@dataclass
class Run:
    path: Path
    config: dict  # flattened, resolved config
    summary: dict
    records: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.summary.get(mk.RUN_STATUS, "missing"))

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def experiment(self):
        """The experiment's name from the config (`name`), e.g. claims_grid."""
        return self.config.get("name")

    @property
    def sweep(self) -> Path:
        """The sweep the run belongs to: Hydra puts a multirun's jobs side by side in one directory."""
        return self.path.parent

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, in logged order."""
        steps, values = [], []
        for record in self.records:
            if key in record and isinstance(record[key], (int, float)):
                steps.append(record["step"])
                values.append(float(record[key]))
        return steps, values

    def at_step(self, key: str, step: int) -> float | None:
        for record in self.records:
            if record.get("step") == step and isinstance(record.get(key), (int, float)):
                return float(record[key])
        return None

    def last(self, key: str) -> float | None:
        """The final value: from summary.json, else the last logged one."""
        value = parse_number(self.summary.get(key))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        _, values = self.series(key)
        return values[-1] if values else None

    def probe_at_end(self, key: str) -> float | None:
        """The probe value at the last step the probe ran."""
        steps, values = self.series(key)
        return values[-1] if values and steps[-1] > 0 else None

    def initial_loss(self) -> float | None:
        """l_0: the training loss at step 0, else the uniform guess log V."""
        value = self.at_step(mk.TRAIN_LOSS, 0)
        if value is not None and math.isfinite(value):
            return value
        log_vocab = self.summary.get(mk.DATA_LOG_VOCAB)
        return float(log_vocab) if isinstance(log_vocab, (int, float)) else None


def _read_config(run_dir: Path, summary: dict) -> dict:
    if isinstance(summary.get("config"), dict):
        tree = summary["config"]
    else:
        tree = OmegaConf.to_container(OmegaConf.load(run_dir / HYDRA_DIR / "config.yaml"), resolve=False)
    flat = flatten(tree)
    if "model.scale" in flat:
        with contextlib.suppress(ValueError):  # a bad value stays as typed; the run itself reported it
            flat["model.scale"] = normalize_scale(flat["model.scale"])
    return flat


def load_run(run_dir: Path) -> Run:
    summary = {k: parse_number(v) for k, v in read_summary(run_dir).items()}
    return Run(run_dir, _read_config(run_dir, summary), summary, read_metrics(run_dir))


def find_run_dirs(roots) -> list[Path]:
    """Every directory under the roots with `.hydra/` and a summary or a metrics file (a run)."""
    found = []
    for root in map(Path, roots):
        if not root.exists():
            raise FileNotFoundError(f"no such directory: {root}")
        for here, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
            path = Path(here)
            if (path / HYDRA_DIR).is_dir() and (SUMMARY_FILE in files or METRICS_FILE in files):
                found.append(path)
    return sorted(set(found))


def load_runs(roots) -> list[Run]:
    return [load_run(path) for path in find_run_dirs(roots)]
