"""C7: without the mask the model reads the future: loss as trained below the entropy floor, far above it at
generation time; causal cells are the control. Judged per seed on runs that trained (progress >=
TRAINED_PROGRESS); an unmasked cell the grid's LR does not train is judged at its best LR of an LR sweep."""

from __future__ import annotations

import math

from andrea_exp.report.bestlr import best_lr_cells
from andrea_exp.report.cells import Cell
from andrea_exp.report.claims.common import (
    ClaimResult,
    cell_stat,
    context_label,
    context_of,
    floor_of,
    run_progress,
    trained,
)
from andrea_exp.report.effects import (
    Effect,
    Place,
    References,
    loss_or_l0,
    paired_values,
    threshold,
    trained_below_bigram,
    twins,
)
from andrea_exp.report.leak_growth import with_growth
from andrea_exp.report.run_status import finished
from andrea_exp.report.seeds import is_short, per_seed, seed_check, seed_vote
from andrea_exp.report.seeds import per_seed as seed_values
from andrea_exp.report.stats import stat
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import (
    Cells,
    Statement,
    dedupe,
    where,
)
from andrea_exp.runs import metric_keys as mk

LEAK_MARGIN = 0.02  # nats below the floor that count as "below" when a run records no floor standard error
FLOOR_SE_KEY = mk.EVAL_FLOOR_SE  # the floor's sampling standard error, recorded by runs since it was added
FLOOR_SE_MULTIPLE = 3.0  # with it: "below" means more than 3 standard errors below the floor
CATASTROPHIC_SHARE = 0.5  # generation loss at least half way from the floor back to log V
TRAINED_PROGRESS = 0.5  # a run "trained" when it closed >= half of (l_0 - floor) with its loss as trained
SAME_MODEL = ("model.d_k", "model.scale", "model.causal", "model.qk_init", "model.qk_layernorm", "model.name")
CAUSAL_CONTROL = "causal control stays at or above the floor"


def margin_of(run) -> float:
    se = run.summary.get(FLOOR_SE_KEY)
    ok = isinstance(se, (int, float)) and not isinstance(se, bool) and math.isfinite(se) and se > 0
    return FLOOR_SE_MULTIPLE * se if ok else LEAK_MARGIN


def _below(run) -> float | None:
    """floor - loss as trained - margin: > 0 when the loss is below the floor by more than the margin."""
    value = run.last(mk.EVAL_BELOW_FLOOR)
    return None if value is None else value - margin_of(run)


def _far(run) -> float | None:
    gen, tr, floor = run.last(mk.EVAL_LOSS_GENERATION), run.last(mk.EVAL_LOSS_AS_TRAINED), floor_of(run)
    log_v = run.summary.get(mk.DATA_LOG_VOCAB)
    if None in (gen, tr, floor) or not isinstance(log_v, (int, float)):
        return None
    # far above the floor AND far above its own loss as trained: an untrained model is also far above the floor
    return min(gen - floor, gen - tr) - CATASTROPHIC_SHARE * (log_v - floor)


def judged_cell(cell: Cell, best: list[Cell]) -> tuple[Cell, str]:
    """The cell's runs that trained; an unmasked cell whose seeds mostly did not train moves to its best LR."""
    ok = [run_progress(r) >= TRAINED_PROGRESS for r in cell.runs]
    if not cell.get("model.causal") and not seed_vote(ok):
        for other in best:
            if all(other.get(k) == cell.get(k) for k in SAME_MODEL):
                return judged_cell_runs(other), f"best LR {other.get('train.lr'):g}"
    return judged_cell_runs(cell), "grid's LR"


def judged_cell_runs(cell: Cell) -> Cell:
    runs = [r for r in cell.runs if floor_of(r) is not None and run_progress(r) >= TRAINED_PROGRESS]
    return Cell(cell.axes, runs, cell.experiment, cell.kind)


def claim(study: Study) -> ClaimResult:
    checks, rows = [], []
    groups, as_trained, generation, floors = [], [], [], []
    best = [b.cell for b in best_lr_cells(study.lr_cells)]
    one_experiment = len({c.experiment for c in study.claim_cells if trained(c)}) == 1  # then bars need no [name]
    margins = set()
    for full_cell in study.claim_cells:
        if not trained(full_cell):
            continue
        cell, at = judged_cell(full_cell, best)
        ctx = {**context_of(full_cell, ("model.causal",)), "at": at}
        skipped = len(full_cell.runs) - len(cell.runs)
        shown = Cell(full_cell.axes, [r for r in full_cell.runs if floor_of(r) is not None], full_cell.experiment)
        if shown.runs:  # the bars show every cell with a floor, trained or not: the table says which trained
            tr = cell_stat(shown, lambda r: r.last(mk.EVAL_LOSS_AS_TRAINED))
            gen = cell_stat(shown, lambda r: r.last(mk.EVAL_LOSS_GENERATION))
            floor = stat(map(floor_of, shown.runs)).mean
            where = context_of(full_cell, ())
            rows.append([context_label(where, skip=()), at, str(tr), str(gen), floor,
                         str(cell_stat(shown, lambda r: r.last(mk.EVAL_BELOW_FLOOR))),
                         stat(r.summary.get(mk.DATA_LOG_VOCAB) for r in shown.runs).mean,
                         f"{len(cell.runs)} of {len(cell.runs) + skipped}"])
            groups.append(context_label(where, skip=("experiment",) if one_experiment else ()))
            as_trained.append((tr.mean, tr.std))
            generation.append((gen.mean, gen.std))
            floors.append(floor)
        if not cell.runs:
            continue
        margins |= {margin_of(r) for r in cell.runs}
        runs = full_cell.runs  # every seed of the place: a vote on fewer is flagged (Check.thin)
        if cell.get("model.causal"):
            found = [seed_check({"part": CAUSAL_CONTROL, **ctx}, per_seed(cell, _below), lambda v: v <= 0,
                                "floor - loss - margin <= 0", lambda m: -m, runs)]
        else:
            found = [seed_check({"part": "loss as trained below the floor", **ctx}, per_seed(cell, _below),
                                lambda v: v > 0, "floor - loss - margin > 0", lambda m: m, runs),
                     seed_check({"part": "generation loss far above the floor and the loss as trained", **ctx},
                                per_seed(cell, _far), lambda v: v >= 0,
                                f"min(gen - floor, gen - as trained) - {CATASTROPHIC_SHARE} x (log V - floor) >= 0",
                                lambda m: m, runs)]
        checks += [c for c in found if c is not None]
    paths = []  # the figure is the report's leak.png (as trained vs causal twin vs generation, per d_k)
    recorded = margins - {LEAK_MARGIN}
    notes = [f"Margin below the floor: {FLOOR_SE_MULTIPLE:g} x the floor's sampling standard error where the run "
             f"records `{FLOOR_SE_KEY}`; else the constant {LEAK_MARGIN} nats. "
             + ("Every run judged records it." if not (margins & {LEAK_MARGIN}) else
                "The runs read do not all record it: the constant is used for those." if recorded else
                "No run read records it: the constant is used.")]
    header = ["cell", "judged at", "loss as trained (all seeds)", "loss at generation", "floor", "floor - as trained",
              "log V", "seeds that trained (judged)"]
    return ClaimResult(
        "C7", "Without the mask the model learns a shortcut; at generation the shortcut is gone",
        "final held-out loss as trained (teacher forcing with the run's own mask), loss at generation time "
        "(each position sees only its prefix), and the data's exact entropy floor, per seed, on the runs that "
        f"trained (progress >= {TRAINED_PROGRESS}); an unmasked cell whose seeds mostly did not train at the grid's "
        "LR is judged at its best LR of an LR sweep when one ran it. Causal cells are the control.",
        f"per seed: 'below the floor' when floor - loss as trained > margin; 'far above' when generation loss minus "
        f"both the floor and the loss as trained >= {CATASTROPHIC_SHARE} x (log V - floor); the causal control (a "
        "check of the measurement, not part of the verdict) when its loss is not below the floor by more than the "
        "margin. A place passes when >= 2/3 of its seeds pass.",
        checks,
        tables=[md_table(header, rows)] if rows else [], figures=paths, notes=notes,
        thresholds={"LEAK_MARGIN": LEAK_MARGIN, "FLOOR_SE_MULTIPLE": FLOOR_SE_MULTIPLE,
                    "CATASTROPHIC_SHARE": CATASTROPHIC_SHARE, "TRAINED_PROGRESS": TRAINED_PROGRESS})


# ---------------------------------------------------------------- the statements (the verdicts)


def c7_leak(c: Cells) -> Statement:
    places = []
    for _, causal, open_ in twins(c.training, "model.causal", True, False):
        ref = c.ref(open_)
        se = [r.last(mk.EVAL_LOSS_SE) for r in causal.runs + open_.runs]
        se = [v for v in se if v is not None and math.isfinite(v)]
        margin = max(threshold("LEAK"), 3 * math.sqrt(2) * (sum(se) / len(se))) if se else threshold("LEAK")
        # a run that diverged counts at its step-0 loss (as in progress), never at a last value it logged
        last = lambda key: lambda run: run.last(key) if finished(run) else None  # noqa: E731
        leak = Effect("twin loss - loss as trained", paired_values(causal, open_, loss_or_l0, loss_or_l0,
                                                                   lambda a, b: a - b), low=margin)
        also = []
        if ref.unigram is not None:
            generation = seed_values(open_, last(mk.EVAL_LOSS_GENERATION))
            also.append(Effect("generation loss - unigram level",
                               {s: v - ref.unigram for s, v in generation.items()}, low=0.0))
        shown = []  # below the floor proves a leak, but a partial shortcut stays above it: shown, not required
        if ref.floor is not None:
            shown.append(Effect("floor - loss as trained", seed_values(open_, last(mk.EVAL_BELOW_FLOOR)), low=0.0))
        extra = {"scale": open_.get("model.scale")}
        if len({x.experiment for x in c.training}) > 1:
            extra["exp"] = open_.experiment
        place = Place(where(open_, **extra), leak, also, shown, unmeasurable=untrained(causal, open_, ref))
        places.append(with_growth(place, causal, open_))
    places = dedupe(places)
    # the headline: the largest leak among places whose causal twin trained (an untrained twin inflates it)
    head = max((p for p in places if p.votes), key=lambda p: (p.effect.stat.mean if p.effect.stat.n else -math.inf),
               default=None)
    short = any(is_short(r) for _, causal, open_ in twins(c.training, "model.causal", True, False)
                for r in causal.runs + open_.runs)
    return Statement("C7", "without the mask a shortcut is learned and fails at generation", places, head,
                     "causal twin (leak >= max(0.1, 3 SE)); generation above the unigram level", short=short)


def untrained(causal: Cell, open_: Cell, ref: References) -> str:
    """Why a leak cannot be measured at this place ("" when it can): the causal twin, the baseline of the leak,
    must have trained (held-out loss TRAINED below the bigram level, mean over seeds)."""
    trained = trained_below_bigram(ref)
    causal_ok, open_ok = (sum(map(trained, x.runs)) * 2 > len(x.runs) for x in (causal, open_))
    if causal_ok:
        return ""
    return "neither twin trained" if not open_ok else "the causal twin did not train"


def statements(c: Cells) -> list[Statement]:
    return [c7_leak(c)]
