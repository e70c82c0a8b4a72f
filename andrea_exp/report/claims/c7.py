"""C7: without the mask the model reads the future: loss as trained below the entropy floor, far above it at
generation time; causal cells are the control."""

from __future__ import annotations

from andrea_exp import metric_keys as mk
from andrea_exp.report import figures
from andrea_exp.report.cells import Cell
from andrea_exp.report.claims.common import (
    ClaimResult,
    cell_stat,
    context_label,
    context_of,
    floor_of,
    missing_runs,
    trained,
)
from andrea_exp.report.rules import NOT_MEASURED, Check, Verdict, verdict
from andrea_exp.report.stats import stat
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table

LEAK_MARGIN = 0.02  # nats below the floor that count as "below" (and the causal control's tolerance)
CATASTROPHIC_SHARE = 0.5  # generation loss at least half way from the floor back to log V
CAUSAL_CONTROL = "causal control stays at or above the floor"


def claim(study: Study) -> ClaimResult:
    checks, rows = [], []
    groups, as_trained, generation, floors = [], [], [], []
    one_experiment = len({c.experiment for c in study.claim_cells if trained(c)}) == 1  # then bars need no [name]
    for full_cell in study.claim_cells:
        cell = Cell(full_cell.axes, [r for r in full_cell.runs if floor_of(r) is not None], full_cell.experiment,
                    full_cell.kind)
        if not cell.runs or not trained(cell):
            continue
        ctx = context_of(cell, ("model.causal",))
        causal = bool(cell.get("model.causal"))
        below = cell_stat(cell, lambda r: r.last(mk.EVAL_BELOW_FLOOR))
        gen = cell_stat(cell, lambda r: r.last(mk.EVAL_LOSS_GENERATION))
        tr = cell_stat(cell, lambda r: r.last(mk.EVAL_LOSS_AS_TRAINED))
        floor = stat(map(floor_of, cell.runs)).mean
        log_v = stat(r.summary.get(mk.DATA_LOG_VOCAB) for r in cell.runs).mean
        if causal:
            if below.n:
                checks.append(Check({"part": CAUSAL_CONTROL, **ctx}, below.mean <= LEAK_MARGIN,
                                    value=f"floor - loss {below}", threshold=f"<= {LEAK_MARGIN}"))
        else:
            if below.n:
                checks.append(Check({"part": "loss as trained below the floor", **ctx}, below.mean > LEAK_MARGIN,
                                    value=f"floor - loss {below}", threshold=f"> {LEAK_MARGIN}"))
            if gen.n and tr.n:
                # far above the floor AND far above its own loss as trained: an untrained model is also far
                # above the floor, but that is no train/generation divergence
                gap = min(gen.mean - floor, gen.mean - tr.mean)
                far = gap >= CATASTROPHIC_SHARE * (log_v - floor)
                checks.append(Check({"part": "generation loss far above the floor and the loss as trained", **ctx},
                                    bool(far), value=f"{gap:.3g} (generation {gen})",
                                    threshold=f">= {CATASTROPHIC_SHARE * (log_v - floor):.3g}"))
        where = context_of(cell, ())
        rows.append([context_label(where, skip=()), str(tr), str(gen), floor, str(below), log_v])
        groups.append(context_label(where, skip=("experiment",) if one_experiment else ()))
        as_trained.append((tr.mean, tr.std))
        generation.append((gen.mean, gen.std))
        floors.append(floor)
    paths = []
    if groups:
        paths.append(figures.grouped_bars(study.fig("c7_leak_gap.png"), groups,
                                          {"as trained": as_trained, "at generation": generation},
                                          ylabel="held-out loss (nats)", title="loss as trained vs at generation",
                                          per_group_marks={"entropy floor": floors}))
    header = ["cell", "loss as trained", "loss at generation", "floor", "floor - as trained", "log V"]
    return ClaimResult(
        "C7", "Without the mask the model learns a shortcut; at generation the shortcut is gone",
        "final held-out loss as trained (teacher forcing with the run's own mask), loss at generation time "
        "(each position sees only its prefix), and the data's exact entropy floor, per cell; causal cells are "
        "the control.",
        f"'below the floor' passes when floor - loss as trained > {LEAK_MARGIN} nats; 'far above' passes when "
        f"generation loss minus both the floor and the loss as trained >= {CATASTROPHIC_SHARE} x (log V - floor); "
        "the causal control (a check of the measurement, not part of the verdict) passes when its "
        f"loss is not below the floor by more than {LEAK_MARGIN}.",
        checks, c7_verdict(checks), tables=[md_table(header, rows)] if rows else [], figures=paths)


def c7_verdict(checks: list[Check]) -> Verdict:
    """The causal control alone measures nothing about the claim: without an unmasked cell it is not measured."""
    claim = [c for c in checks if c.where["part"] != CAUSAL_CONTROL]
    if not claim:
        return Verdict(NOT_MEASURED, missing_runs("unmasked cell (model.causal=false) with a known floor", "leak_gap"))
    result = verdict(claim)  # the control is a sanity check of the measurement, not a part of the claim
    if not all(c.ok for c in checks if c.where["part"] == CAUSAL_CONTROL):
        result.condition = (result.condition + "; " if result.condition else "") + \
            "WARNING: a causal cell went below the floor, so the floor or the evaluation is suspect"
    return result
