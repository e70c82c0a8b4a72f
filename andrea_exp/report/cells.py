"""Runs -> experiments -> cells. Nothing here is hand-listed: what splits runs comes from the runs themselves,
whichever sweep each came from (one sweep or several give the same experiments and cells).

- A study axis is a scientific setting (andrea_exp.config.schema.is_scientific) in which two of the runs given
  differ alone (d_k, scale, causal, lr, weight_decay, ...): the runs sweep it, in one sweep or across sweeps.
  Data settings and train.max_steps are never axes: they say what an experiment is read against (its
  references, the data box's source, T and steps).
- An experiment is the runs that agree on every other scientific setting (model size, data, schedule): runs
  of several presets with one setup pool (claims_grid's unit-init cells serve qk_init; a causal sweep and an
  unmasked one with another eval cadence are one experiment), and one preset run at two setups splits in two,
  each labelled with the settings that tell it apart. Operational settings (eval and probe cadence, logging,
  launcher, checkpointing, compile) never split anything.
- Within an experiment, the study axes that vary define the cells; seeds are replicates. A cell keeps its runs
  that vote (andrea_exp.report.run_status) and, apart, the runs that failed: these measure nothing, and the
  report names them.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from andrea_exp.config.schema import is_scientific
from andrea_exp.report.run_status import votes, why_excluded
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


def defines_experiment(key: str) -> bool:
    """Settings that tell experiments apart and never become an axis: the data (what the references are
    measured on) and the run's length."""
    return key.startswith("data.") or key == "train.max_steps"


def science(run: Run) -> dict:
    return {k: v for k, v in run.config.items() if is_scientific(k)}


def identity(run: Run) -> str:
    """What makes two runs the same initialisation and training: scientific settings and the seed."""
    return json.dumps([science(run), run.seed], sort_keys=True, default=str)


def study_axes(runs: list[Run]) -> list[str]:
    """Scientific settings in which two of the runs differ and in nothing else scientific (seeds aside), data
    settings and train.max_steps excepted. Depends on the runs only, never on how they were split into sweeps."""
    configs = {_fingerprint(c): c for c in map(science, runs)}.values()
    found = set()
    for a, b in itertools.combinations(configs, 2):
        differ = [k for k in a.keys() | b.keys() if _fingerprint(a.get(k)) != _fingerprint(b.get(k))]
        if len(differ) == 1 and not defines_experiment(differ[0]):
            found.add(differ[0])
    return _in_display_order(found)


@dataclass
class Cell:
    axes: dict  # study axis -> value, over the axes that vary within the cell's experiment
    runs: list[Run]
    experiment: str = ""  # the experiment's label (its runs' `name`s)
    kind: str = TRAINING
    excluded: list[Run] = field(default_factory=list)  # runs that failed (run_status.votes): they do not vote

    @property
    def label(self) -> str:
        return " ".join(f"{short(k)}={v}" for k, v in self.axes.items()) or "(one cell)"

    def get(self, key: str):
        """A setting shared by the cell's runs (axes or not); a cell whose every run failed reads its failed ones."""
        return self.axes.get(key, (self.runs or self.excluded)[0].config.get(key))

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
        ordered = sorted(map(_split_failed, cells.values()), key=lambda c: [sort_key(v) for v in c.axes.values()])
        experiments.append(Experiment(label, kind, {k: setup.get(k) for k in telling}, axes, ordered))
    _disambiguate(experiments)
    return sorted(experiments, key=lambda e: (e.kind != TRAINING, e.label))


def _split_failed(cell: Cell) -> Cell:
    """The cell's voting runs, and apart its failed ones, less those run again (a voting run of the same settings
    and seed replaces them)."""
    voting = [run for run in cell.runs if votes(run)]
    again = {identity(run) for run in voting}
    failed = [run for run in cell.runs if not votes(run) and identity(run) not in again]
    return Cell(cell.axes, voting, cell.experiment, cell.kind, failed)


def failed_lines(cells: list[Cell], most: int = 5) -> list[str]:
    """The failed runs the cells leave out, one line each (`most` at most, then how many more):
    'failed: OutOfMemoryError at step 9, excluded ([claims_120m] d_k=4096 scale=sqrt, seed 0, sweep/3)'."""
    seen, lines = set(), []
    for cell in cells:
        for run in cell.excluded:
            if run.path not in seen:
                seen.add(run.path)
                where = f"[{cell.experiment}] {cell.label}, seed {run.seed}, {run.path.parent.name}/{run.path.name}"
                lines.append(f"{why_excluded(run)} ({where})")
    return lines[:most] + ([f"{len(lines) - most} more failed runs excluded (appendix: Runs and cells)"]
                           if len(lines) > most else [])


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
