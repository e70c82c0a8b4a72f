"""C4: peaked softmax makes the gradient through it vanish, and training stalls (scaled/unscaled pairs)."""

from __future__ import annotations

import math
from pathlib import Path

from andrea_exp import metric_keys as mk
from andrea_exp.report import figures
from andrea_exp.report.cells import Cell
from andrea_exp.report.claims.common import (
    VANISH_RATIO,
    ClaimResult,
    at_init,
    cell_stat,
    context_label,
    context_of,
    floor_of,
    grad_scores_figure,
    missing_runs,
    run_progress,
    scale_pairs,
    trained,
)
from andrea_exp.report.rules import Check, verdict
from andrea_exp.report.stats import sort_key, stat
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table

STALL_RATIO = 0.5  # "stalls": closes less than half the share of (l_0 - floor) that the scaled twin closes


def loss_curve(cell: Cell) -> tuple[list, list, list]:
    """(steps, mean, std) of the training loss over the cell's seeds, at the steps some seed logged."""
    per_step: dict[int, list[float]] = {}
    for run in cell.runs:
        for s, v in zip(*run.series(mk.TRAIN_LOSS)):
            per_step.setdefault(s, []).append(v)
    steps = sorted(per_step)
    stats = [stat(per_step[s]) for s in steps]
    keep = [i for i, st in enumerate(stats) if st.n]
    return [steps[i] for i in keep], [stats[i].mean for i in keep], [stats[i].std for i in keep]


def loss_curves_figure(study: Study) -> Path | None:
    """One panel per (experiment, d_k) of the training cells; one line per remaining axes (seeds: mean, band)."""
    panels: dict[tuple, dict] = {}
    for cell in study.claim_cells:
        if not trained(cell):
            continue
        curve = loss_curve(cell)
        if not curve[0]:
            continue
        ctx = context_of(cell, ())
        panel = panels.setdefault((cell.experiment, sort_key(ctx["d_k"])), {
            "title": f"[{cell.experiment}] d_k={ctx['d_k']}", "curves": {}, "floor": None})
        panel["curves"][f"{context_label(ctx, skip=('d_k', 'experiment'))} (n={len(cell.runs)})"] = curve
        floors = [f for f in map(floor_of, cell.runs) if f is not None]
        panel["floor"] = floors[0] if floors else panel["floor"]
    if not panels:
        return None
    return figures.loss_curve_panels(study.fig("loss_curves.png"), [panels[k] for k in sorted(panels)],
                                     title="training loss (mean over seeds, band: one std)")


def claim(study: Study) -> ClaimResult:
    checks, rows = [], []
    for ctx, scaled, unscaled in scale_pairs(study.claim_cells):
        g_s, g_u = cell_stat(scaled, at_init(mk.GRAD_SCORES)), cell_stat(unscaled, at_init(mk.GRAD_SCORES))
        if g_s.n and g_u.n and g_s.mean > 0:
            ratio = g_u.mean / g_s.mean
            checks.append(Check({"part": "gradient through softmax vanishes", **ctx}, ratio <= VANISH_RATIO,
                                value=f"ratio {ratio:.3g} ({g_u} / {g_s.mean:.3g})",
                                threshold=f"<= {VANISH_RATIO}"))
        else:
            ratio = math.nan
        p_s, p_u = cell_stat(scaled, run_progress), cell_stat(unscaled, run_progress)
        if trained(scaled) and trained(unscaled):
            checks.append(Check({"part": "training stalls", **ctx}, bool(p_u.mean < STALL_RATIO * p_s.mean),
                                value=f"progress {p_u} (scaled {p_s.mean:.3g})",
                                threshold=f"< {STALL_RATIO} x scaled = {STALL_RATIO * p_s.mean:.3g}"))
        peaked = cell_stat(unscaled, at_init(mk.ATTN_MAX_PROB))
        if not (trained(scaled) and trained(unscaled)):
            p_s = p_u = stat([])  # an init-only experiment took no step: no progress to show
        rows.append([context_label(ctx), ctx["d_k"], str(peaked), str(g_s), str(g_u), ratio, str(p_s), str(p_u),
                     ", ".join(r.status for r in unscaled.runs)])
    paths = [p for p in (loss_curves_figure(study), grad_scores_figure(study)) if p is not None]
    header = ["where", "d_k", "unscaled max prob at init", "grad/scores at init, scaled", "grad/scores at init, "
              "unscaled", "ratio unscaled/scaled", "progress, scaled", "progress, unscaled", "unscaled status"]
    missing = missing_runs("pair of cells differing only in model.scale (true/false)", "claims_grid")
    return ClaimResult(
        "C4", "Peaked softmax makes gradients vanish elsewhere, and training stalls",
        "for each pair of cells that differ only in the divisor: the norm of d loss / d scores at step 0 "
        "(`grad/scores`, all layers) and training progress = (l_0 - final held-out loss) / (l_0 - floor), "
        "l_0 the step-0 training loss, floor the data's entropy floor (0 when unknown); diverged runs have "
        "progress 0. Whether it depends on q/k initialisation shows as the qk_init column when it is an axis.",
        f"'gradient vanishes' passes when unscaled grad/scores <= {VANISH_RATIO} x scaled; 'training stalls' "
        f"passes when unscaled progress < {STALL_RATIO} x scaled progress.",
        checks, verdict(checks, missing), tables=[md_table(header, rows)] if rows else [], figures=paths)
