"""C5: with the divisor, scores stay near unit scale whatever d_k, softmax is not peaked, training proceeds."""

from __future__ import annotations

import math

from andrea_exp import metric_keys as mk
from andrea_exp.report import figures
from andrea_exp.report.claims.common import (
    PEAKED_MAX_PROB,
    ClaimResult,
    at_init,
    cell_stat,
    context_label,
    context_of,
    missing_runs,
    run_progress,
    trained,
)
from andrea_exp.report.rules import Check, verdict
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table

UNIT_SCALE = (0.5, 2.0)  # "near unit scale": score std within a factor 2 of 1
PROCEEDS_PROGRESS = 0.5  # "training proceeds": finished and closed >= 50 % of (l_0 - floor)


def claim(study: Study) -> ClaimResult:
    checks, rows = [], []
    series: dict[str, list] = {}
    for cell in study.claim_cells:
        ctx = context_of(cell, ("model.scale",))
        mode = cell.get("model.scale")
        std = cell_stat(cell, at_init(mk.ATTN_SCORE_STD))
        if std.n:
            series.setdefault(f"{context_label(ctx)} scale={mode}", []).append((ctx["d_k"], std.mean, std.std))
        if mode != "sqrt":
            continue
        peak, prog = cell_stat(cell, at_init(mk.ATTN_MAX_PROB)), cell_stat(cell, run_progress)
        if std.n:
            near_unit = UNIT_SCALE[0] <= std.mean <= UNIT_SCALE[1]
            checks.append(Check({"part": "score std near 1 at init", **ctx}, near_unit, value=str(std),
                                threshold=f"in [{UNIT_SCALE[0]}, {UNIT_SCALE[1]}]"))
        if peak.n:
            checks.append(Check({"part": "softmax not peaked at init", **ctx}, peak.mean < PEAKED_MAX_PROB,
                                value=f"max prob {peak}", threshold=f"< {PEAKED_MAX_PROB}"))
        finished = all(r.status == "finished" for r in cell.runs)
        if trained(cell):
            statuses = ", ".join(sorted({r.status for r in cell.runs}))
            checks.append(Check({"part": "training proceeds", **ctx}, finished and prog.mean >= PROCEEDS_PROGRESS,
                                value=f"progress {prog}, {statuses}",
                                threshold=f"all finished, >= {PROCEEDS_PROGRESS}"))
        rows.append([context_label(ctx), ctx["d_k"], str(std), str(peak), str(prog) if trained(cell) else "-",
                     ", ".join(r.status for r in cell.runs)])
    d_ks = sorted({p[0] for pts in series.values() for p in pts})
    path = None
    if series:
        path = figures.line_panels(study.fig("c5_score_std.png"), [{
            "title": "std of the scores softmax sees, step 0", "xlabel": "d_k", "ylabel": mk.ATTN_SCORE_STD,
            "series": series,
            "refs": [("sqrt(d_k)", d_ks, [math.sqrt(d) for d in d_ks]), ("1", d_ks, [1.0] * len(d_ks))],
            "logx": 2, "logy": True}], n_cols=1)
    header = ["where", "d_k", "score std at init", "max prob at init", "progress", "status"]
    return ClaimResult(
        "C5", "With the divisor, scores stay near unit scale whatever d_k; softmax behaves and training proceeds",
        "for every scaled cell: std of the scaled scores at step 0 (`attn/score_std`, visible entries), mean max "
        "probability at step 0, and training progress (as in C4).",
        f"passes per cell and part: score std within [{UNIT_SCALE[0]}, {UNIT_SCALE[1]}]; mean max prob < "
        f"{PEAKED_MAX_PROB}; every seed finished and progress >= {PROCEEDS_PROGRESS}.",
        checks, verdict(checks, missing_runs("scaled cells", "claims_grid")),
        tables=[md_table(header, rows)] if rows else [], figures=[path] if path else [])
