"""Runs -> experiments -> cells. Nothing here is hand-listed: what splits runs comes from the runs themselves.

- A study axis is a scientific setting (andrea_exp.config.schema.is_scientific) that takes more than one value
  among the runs of one sweep: what some sweep swept (d_k, scale, lr, weight_decay, ...).
- An experiment is the runs that agree on every other scientific setting (model size, data, schedule): runs
  of several presets with one setup pool (claims_grid's unit-init cells serve qk_init), and one preset run
  at two setups splits in two, each labelled with the settings that tell it apart.
- Within an experiment, the study axes that vary define the cells; seeds are replicates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from andrea_exp.config.schema import is_scientific
from andrea_exp.report.runs import Run
from andrea_exp.report.stats import sort_key

# Display preference only: these axes come first in labels and tables, the rest in name order.
PREFERRED_AXES = ("model.d_k", "model.scale", "model.causal", "model.qk_init", "model.qk_layernorm",
                  "model.mask_fill", "train.lr", "model.name")
LR = "train.lr"

# Kinds of experiment: what its runs can say.
TRAINING, INIT_ONLY, LR_SWEEP = "training", "init only", "lr sweep"


def short(axis: str) -> str:
    """model.d_k -> d_k, train.lr -> lr: the names a reader of the report knows."""
    return axis.split(".", 1)[1] if axis.startswith(("model.", "train.")) else axis


def _fingerprint(values) -> str:
    return json.dumps(values, sort_keys=True, default=str)


def _in_display_order(keys) -> list[str]:
    keys = set(keys)
    return [k for k in PREFERRED_AXES if k in keys] + sorted(keys - set(PREFERRED_AXES))


def _varying(configs: list[dict]) -> list[str]:
    """Keys whose value is not the same in every config, in display order."""
    keys = {k for c in configs for k in c}
    return _in_display_order(k for k in keys if len({_fingerprint(c.get(k)) for c in configs}) > 1)


def study_axes(runs: list[Run]) -> list[str]:
    """Scientific settings that vary among the runs of at least one sweep."""
    by_sweep: dict = {}
    for run in runs:
        by_sweep.setdefault(run.sweep, []).append(run.config)
    return _in_display_order(k for configs in by_sweep.values() for k in _varying(configs) if is_scientific(k))


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


def _kind(runs: list[Run], axes: list[str]) -> str:
    if LR in axes:
        return LR_SWEEP
    if all((run.config.get("train.max_steps") or 0) == 0 for run in runs):
        return INIT_ONLY
    return TRAINING


def group_experiments(runs: list[Run]) -> list[Experiment]:
    """Experiments (training ones first, then by label), each with its cells in axis-value order."""
    axes_all = set(study_axes(runs))

    def setup_of(run: Run) -> dict:
        return {k: v for k, v in run.config.items() if is_scientific(k) and k not in axes_all}

    by_setup: dict[str, list[Run]] = {}
    for run in runs:
        by_setup.setdefault(_fingerprint(setup_of(run)), []).append(run)
    setups = [setup_of(group[0]) for group in by_setup.values()]
    telling = _varying(setups)
    experiments = []
    for group, setup in zip(by_setup.values(), setups):
        names = sorted({str(run.experiment) for run in group if run.experiment is not None}) or ["runs"]
        axes = [a for a in _varying([run.config for run in group]) if a in axes_all]
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
