"""Runs on disk -> Run objects, grouped into cells (one cell = one setting of the swept axes; seeds replicate).

Reads only what the training loop writes: `.hydra/`, `metrics.jsonl`, `summary.json`. Nothing here
needs W&B.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from andrea_exp.attention import normalize_scale
from andrea_exp.rundir import parse_number, read_metrics, read_summary

# Settings that say nothing about the science, so they never split runs into cells or experiments: the replicate
# (seed), the experiment's name (kept as Run.experiment), how the launcher packed runs onto GPUs, logging and
# checkpoint cadence, where it ran, and how often / on how much the probe looked. A key ending in "." covers its
# whole subtree. Everything else in the config is a scientific setting.
NON_SCIENTIFIC_KEYS = (
    "seed", "name", "cells_per_gpu", "hydra.", "launcher.", "logger.",
    "train.progress", "train.device", "train.compile", "train.eval_every", "train.log_every", "train.ckpt_every",
    "train.resume", "train.sample_tokens",
    "probe.every", "probe.maps_every", "probe.batch_size", "probe.maps_heads", "probe.per_head",
)
# The axes the claims compare across. Runs that agree on every other scientific setting form one experiment
# (same data, model size, schedule); within it, the study axes that vary define the cells.
STUDY_AXES = ("model.d_k", "model.scale", "model.causal", "model.qk_init", "model.qk_layernorm",
              "model.mask_fill", "train.lr")
# Axes shown first in labels.
PREFERRED_AXES = STUDY_AXES + ("model.name",)
SKIP_DIRS = {"wandb", "checkpoints", "attention_maps", ".hydra"}


def flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def short(axis: str) -> str:
    """model.d_k -> d_k, train.lr -> lr: the names a reader of the report knows."""
    return axis.split(".", 1)[1] if axis.startswith(("model.", "train.")) else axis


@dataclass
class Run:
    path: Path
    config: dict  # flattened, resolved config
    summary: dict
    records: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.summary.get("run/status", "missing"))

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def experiment(self):
        """The experiment's name from the config (`name`), e.g. claims_grid."""
        return self.config.get("name")

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
        value = self.at_step("train/loss", 0)
        if value is not None and math.isfinite(value):
            return value
        log_vocab = self.summary.get("data/log_vocab")
        return float(log_vocab) if isinstance(log_vocab, (int, float)) else None


def _read_config(run_dir: Path, summary: dict) -> dict:
    if isinstance(summary.get("config"), dict):
        tree = summary["config"]
    else:
        tree = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"), resolve=False)
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
            if (path / ".hydra").is_dir() and ("summary.json" in files or "metrics.jsonl" in files):
                found.append(path)
    return sorted(set(found))


def load_runs(roots) -> list[Run]:
    return [load_run(path) for path in find_run_dirs(roots)]


def is_scientific(key: str) -> bool:
    return not any(key == k or (k.endswith(".") and key.startswith(k)) for k in NON_SCIENTIFIC_KEYS)


def _fingerprint(values: dict) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def _differing(settings: list[dict]) -> list[str]:
    """Keys whose value is not the same in every dict, preferred axes first."""
    keys = sorted({k for s in settings for k in s})
    varying = [k for k in keys if len({_fingerprint(s.get(k)) for s in settings}) > 1]
    return [a for a in PREFERRED_AXES if a in varying] + [a for a in varying if a not in PREFERRED_AXES]


# Kinds of experiment: what its runs can say.
TRAINING, INIT_ONLY, LR_SWEEP = "training", "init only", "lr sweep"


@dataclass
class Cell:
    axes: dict  # study axis -> value, over the axes that vary within the cell's experiment
    runs: list[Run]
    experiment: str = ""  # the experiment's label (its runs' `name`s)
    kind: str = TRAINING

    @property
    def label(self) -> str:
        return " ".join(f"{short(k)}={v}" for k, v in self.axes.items()) or "(one cell)"

    def get(self, key: str):
        """A setting shared by the cell's runs (axes or not)."""
        return self.axes.get(key, self.runs[0].config.get(key))

    @property
    def seeds(self) -> list:
        return [run.seed for run in self.runs]


@dataclass
class Experiment:
    label: str
    kind: str
    setup: dict  # scientific settings, other than the study axes, that tell it apart from the other experiments
    axes: list[str]  # study axes that vary within it
    cells: list[Cell]


def _setup_of(run: Run) -> dict:
    return {k: v for k, v in run.config.items() if is_scientific(k) and k not in STUDY_AXES}


def _kind(runs: list[Run], axes: list[str]) -> str:
    if "train.lr" in axes:
        return LR_SWEEP
    if all((run.config.get("train.max_steps") or 0) == 0 for run in runs):
        return INIT_ONLY
    return TRAINING


def group_experiments(runs: list[Run]) -> list[Experiment]:
    """Runs agreeing on every scientific setting but the study axes form one experiment; cells within it."""
    by_setup: dict[str, list[Run]] = {}
    for run in runs:
        by_setup.setdefault(_fingerprint(_setup_of(run)), []).append(run)
    setups = [_setup_of(group[0]) for group in by_setup.values()]
    telling = _differing(setups)
    experiments = []
    for group, setup in zip(by_setup.values(), setups):
        names = sorted({str(run.experiment) for run in group if run.experiment is not None}) or ["runs"]
        axes = [a for a in STUDY_AXES if len({_fingerprint(run.config.get(a)) for run in group}) > 1]
        kind = _kind(group, axes)
        label = "+".join(names)
        cells: dict[str, Cell] = {}
        for run in group:
            values = {a: run.config.get(a) for a in axes}
            cells.setdefault(_fingerprint(values), Cell(values, [], label, kind)).runs.append(run)
        ordered = sorted(cells.values(), key=lambda c: [sort_key(v) for v in c.axes.values()])
        experiments.append(Experiment(label, kind, {k: setup.get(k) for k in telling}, axes, ordered))
    _disambiguate(experiments)
    return sorted(experiments, key=lambda e: (e.kind != TRAINING, e.label))


def _disambiguate(experiments: list[Experiment]) -> None:
    """Two experiments with one name (e.g. one sweep at two seq_len) get their telling settings in the label."""
    seen: dict[str, int] = {}
    for e in experiments:
        seen[e.label] = seen.get(e.label, 0) + 1
    for e in experiments:
        if seen[e.label] > 1:
            e.label += " (" + ", ".join(f"{short(k)}={v}" for k, v in e.setup.items()) + ")"
            for cell in e.cells:
                cell.experiment = e.label


def group_cells(runs: list[Run]) -> list[Cell]:
    return [cell for e in group_experiments(runs) for cell in e.cells]


def sort_key(value):
    """Numbers in numeric order, then everything else as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


@dataclass
class Stat:
    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        if self.n == 0:
            return "-"
        return f"{self.mean:.4g} ± {self.std:.2g} (n={self.n})" if self.n > 1 else f"{self.mean:.4g} (n=1)"


def stat(values) -> Stat:
    """Mean and sample standard deviation of the finite values (n counts them)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return Stat(math.nan, math.nan, 0)
    mean = sum(finite) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else 0.0
    return Stat(mean, std, n)
