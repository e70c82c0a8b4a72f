"""C7's leak over training, not only at the end: per evaluation step, the causal twin's held-out loss minus the
unmasked run's loss as trained (same seed). A shortcut is learned late and suddenly, so a leak below the
threshold that is still growing at the last evaluation says the run was too short: such a place reads "not
reached within N steps" (N the last evaluation step), set aside from "does not hold".

Growing: the leak rose over the last evaluation interval by more than GROWING_SE standard errors of a leak
value (sqrt(2) x the mean `eval/loss_se` of the pair's last evaluations: a difference of two runs' losses).
A place is not reached when its leak does not hold (below the threshold or inconclusive) and >= 2/3 of its
seeds are still growing.
"""

from __future__ import annotations

import math
from dataclasses import replace

from andrea_exp.report.cells import Cell
from andrea_exp.report.effects import HOLDS, NOT_MEASURED, Effect, Place
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import seed_vote
from andrea_exp.report.set_aside import SetAside
from andrea_exp.runs import metric_keys as mk

GROWING_SE = 1.0  # the last interval's rise, in standard errors of a leak value, that counts as still growing


def not_reached(steps: int) -> str:
    return f"not reached within {steps} steps (leak still growing)"


def leak_series(causal: Run, open_: Run) -> list[tuple[int, float]]:
    """(step, causal loss - unmasked loss as trained) at every step both evaluated."""
    a = dict(zip(*causal.series(mk.EVAL_LOSS_AS_TRAINED)))
    b = dict(zip(*open_.series(mk.EVAL_LOSS_AS_TRAINED)))
    return [(s, a[s] - b[s]) for s in sorted(a.keys() & b.keys()) if math.isfinite(a[s] - b[s])]


def leak_se(causal: Run, open_: Run) -> float | None:
    se = [r.last(mk.EVAL_LOSS_SE) for r in (causal, open_)]
    se = [v for v in se if v is not None and math.isfinite(v)]
    return math.sqrt(2) * sum(se) / len(se) if se else None


def last_rise(series: list[tuple[int, float]]) -> float | None:
    """The leak's change over the last evaluation interval; None with fewer than two evaluations."""
    return series[-1][1] - series[-2][1] if len(series) >= 2 else None


def is_growing(series: list[tuple[int, float]], se: float | None) -> bool | None:
    rise = last_rise(series)
    if rise is None or se is None:
        return None
    return rise > GROWING_SE * se


def pairs(causal: Cell, open_: Cell) -> dict:
    """seed -> (causal run, unmasked run), for the seeds both cells ran and both finished."""
    a = {r.seed: r for r in causal.runs if r.status == "finished"}
    b = {r.seed: r for r in open_.runs if r.status == "finished"}
    return {s: (a[s], b[s]) for s in a.keys() & b.keys()}


def rise_effect(causal: Cell, open_: Cell) -> Effect:
    """Per seed, the leak's rise over the last evaluation interval (shown beside the leak, not deciding)."""
    values = {s: last_rise(leak_series(c, o)) for s, (c, o) in pairs(causal, open_).items()}
    return Effect("leak rise over the last evaluation interval", {s: v for s, v in values.items() if v is not None})


def with_growth(place: Place, causal: Cell, open_: Cell) -> Place:
    """The place with its leak's last rise shown; set aside as not reached when its leak does not hold and
    >= 2/3 of its seeds are still growing."""
    rise = rise_effect(causal, open_)
    shown = [*place.shown, rise] if rise.values else place.shown
    found = pairs(causal, open_)
    growing = [is_growing(leak_series(c, o), leak_se(c, o)) for c, o in found.values()]
    measured = [g for g in growing if g is not None]
    # a place that cannot measure the leak (its causal twin did not train) stays not measured, never "not reached"
    if place.unmeasurable or place.effect.decision in (HOLDS, NOT_MEASURED) or not measured or not seed_vote(measured):
        return replace(place, shown=shown)
    steps = max(leak_series(c, o)[-1][0] for c, o in found.values() if leak_series(c, o))
    return SetAside(place.where, place.effect, place.also, shown, reason=not_reached(steps))
