"""Memorising told from stalling: a run whose held-out loss rose well above its best while its training loss
(on fixed training windows, `eval/loss_train_split`) kept falling has memorised its training data. Its final
held-out loss then says nothing about whether training stalls or proceeds: such seeds are taken out of C4b's
and C5b's votes and their places named (`set_aside.SetAside`), never counted as a stall.

Rule, per run, on its evaluations: best = the lowest held-out loss, at step b; rise = last held-out loss -
best. Memorised when rise >= MEMORISED_SE x the last evaluation's standard error (`eval/loss_se`) AND the
training-split loss at the last evaluation is below its value at step b. The training-split loss is scored on
the same windows at every evaluation, so its fall between two steps carries no sampling noise of the windows:
any fall counts. A run that logged no training-split loss (older runs) is not measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from andrea_exp.report.cells import Cell
from andrea_exp.report.effects import NOT_MEASURED, Effect, Place
from andrea_exp.report.runs import Run
from andrea_exp.report.set_aside import SetAside
from andrea_exp.runs import metric_keys as mk

MEMORISED_SE = 3.0  # the held-out loss rose by at least this many standard errors above its best
MEMORISED = "memorised (held-out loss rose >= 3 SE above its best while the training loss fell)"


@dataclass(frozen=True)
class Memorisation:
    best_step: int
    best: float  # lowest held-out loss
    last_step: int
    last: float  # held-out loss at the last evaluation
    se: float  # its standard error
    train_at_best: float  # training-split loss at best_step
    train_last: float  # and at the last evaluation

    @property
    def rise(self) -> float:
        return self.last - self.best

    @property
    def memorised(self) -> bool:
        return self.rise >= MEMORISED_SE * self.se and self.train_last < self.train_at_best

    def text(self) -> str:
        return (f"held-out {self.best:.3f} (step {self.best_step}) -> {self.last:.3f} (step {self.last_step}), "
                f"+{self.rise / self.se:.1f} SE; training split {self.train_at_best:.3f} -> {self.train_last:.3f}")


def _finite(steps: list[int], values: list[float]) -> dict[int, float]:
    return {s: v for s, v in zip(steps, values) if math.isfinite(v)}


def memorisation(run: Run) -> Memorisation | None:
    """The run's held-out and training-split losses at its best and last evaluations; None when it logged no
    training-split loss, fewer than two evaluations, or no standard error."""
    held = _finite(*run.series(mk.EVAL_LOSS_AS_TRAINED))
    train = _finite(*run.series(mk.EVAL_LOSS_TRAIN_SPLIT))
    se = _finite(*run.series(mk.EVAL_LOSS_SE))
    steps = sorted(held.keys() & train.keys())
    if len(steps) < 2 or steps[-1] not in se or not se[steps[-1]] > 0:
        return None
    best = min(steps, key=lambda s: (held[s], s))
    last = steps[-1]
    return Memorisation(best, held[best], last, held[last], se[last], train[best], train[last])


def is_memorised(run: Run) -> bool:
    found = memorisation(run)
    return found is not None and found.memorised


def memorised_seeds(*cells: Cell) -> set:
    """Seeds of which a run in any of the cells memorised (twins share a seed: one memorised run spoils the pair)."""
    return {run.seed for cell in cells for run in cell.runs if is_memorised(run)}


def training_split_effect(cell: Cell, progress) -> Effect | None:
    """Progress (progress(loss): References.progress) read on the training-split loss at the end, per seed:
    shown beside the held-out progress; None when no run logged it."""
    values = {}
    for run in cell.runs:
        loss = run.last(mk.EVAL_LOSS_TRAIN_SPLIT) if run.status == "finished" else None
        value = progress(loss) if loss is not None else None
        if value is not None and math.isfinite(value):
            values[run.seed] = value
    return Effect("progress on the training split", values) if values else None


def without_memorised(place: Place, *cells: Cell) -> Place:
    """The place with every seed that memorised (in any of the cells) out of its deciding effects, those seeds
    named in its `where`; a place left with no seed is set aside as memorised, never counted as a stall."""
    seeds = memorised_seeds(*cells)
    if not seeds or place.unmeasurable:  # a place that cannot measure the claim does not vote either way
        return place
    keep = lambda e: Effect(e.name, {s: v for s, v in e.values.items() if s not in seeds}, e.low, e.high)  # noqa: E731
    effect, also = keep(place.effect), [keep(e) for e in place.also]
    if not effect.values:
        return SetAside(place.where, place.effect, place.also, place.shown, reason=MEMORISED, alone=NOT_MEASURED)
    return replace(place, where={**place.where, "memorised": seeds_text(seeds)}, effect=effect, also=also)


def seeds_text(seeds) -> str:
    return "seed " + ", ".join(map(str, sorted(seeds, key=str)))


def drop_memorised(where: dict, values: dict, *cells: Cell) -> tuple[dict, dict]:
    """The per-check claims' form (claims.c4, claims.c5): seed -> value without the seeds that memorised in any
    of the cells, and `where` naming them."""
    seeds = memorised_seeds(*cells)
    if not seeds:
        return where, values
    return {**where, "memorised": seeds_text(seeds)}, {s: v for s, v in values.items() if s not in seeds}


def beside_training_loss(place: Place, progress, cell: Cell, *twins: Cell) -> Place:
    """C4b's and C5b's place with the training-split progress (progress(loss)) of `cell` shown beside its
    held-out progress, and the seeds that memorised (in the cell or its twins) out of the vote (without_memorised)."""
    train = training_split_effect(cell, progress)
    shown = place.shown + ([train] if train is not None else [])
    return without_memorised(replace(place, shown=shown), cell, *twins)


def memorised_runs(runs: list[Run]) -> list[tuple[Run, Memorisation]]:
    out = []
    for run in runs:
        found = memorisation(run)
        if found is not None and found.memorised:
            out.append((run, found))
    return out


def memorised_warning(runs: list[Run], label) -> str | None:
    """The data box's line naming the runs that memorised; label(run) names one."""
    found = memorised_runs(runs)
    if not found:
        return None
    return (f"{len(found)} runs memorised their training data (held-out loss rose >= {MEMORISED_SE:g} SE above its "
            "best while the training-split loss fell; not counted as stalls): "
            + "; ".join(f"{label(run)}: {m.text()}" for run, m in found))
