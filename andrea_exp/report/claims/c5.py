"""C5: with the divisor, scores stay near unit scale whatever d_k, softmax is not peaked, training proceeds.
"Whatever d_k" is judged as an invariance: the ratio of the scaled score std at the largest d_k to the
smallest, at init and over training, in every experiment and at every LR of the LR sweep."""

from __future__ import annotations

import math

from andrea_exp.report import figures
from andrea_exp.report.cells import INIT_ONLY, LR_SWEEP
from andrea_exp.report.claims.common import (
    PEAKED_MAX_PROB,
    ClaimResult,
    at_init,
    cell_stat,
    context_label,
    context_of,
    run_progress,
    trained,
)
from andrea_exp.report.effects import PHASES, Effect, Place, groups, paired_values, progress_of, threshold
from andrea_exp.report.memorisation import beside_training_loss, drop_memorised
from andrea_exp.report.rules import Check
from andrea_exp.report.seeds import per_seed, seed_check, window_mean
from andrea_exp.report.seeds import per_seed as seed_values
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import (
    Cells,
    Statement,
    dedupe,
    is_causal,
    lr_text,
    max_dk,
    no_reference,
    where,
)
from andrea_exp.report.verdicts import pick as pick_place
from andrea_exp.runs import metric_keys as mk

UNIT_SCALE = (0.5, 2.0)  # "near unit scale": score std within a factor 2 of 1
INVARIANCE_FACTOR = 2.0  # "whatever d_k": std at the largest d_k within 2x of that at the smallest
PROCEEDS_PROGRESS = 0.5  # "training proceeds": finished and closed >= 50 % of (l_0 - floor)
OVER_TRAINING = (1, 10 ** 12)  # steps of "over training": every probe after step 0


def invariance_checks(study: Study) -> tuple[list[Check], list[list]]:
    groups: dict[str, tuple[dict, dict]] = {}
    for cell in study.claim_cells + study.lr_cells:
        if cell.get("model.scale") != "sqrt":
            continue
        ctx = context_of(cell, ("model.scale",))
        rest = {k: v for k, v in ctx.items() if k != "d_k"}
        groups.setdefault(context_label(ctx), (rest, {}))[1][ctx["d_k"]] = cell
    checks, rows = [], []
    for rest, by_dk in groups.values():
        d_ks = sorted(by_dk)
        if len(d_ks) < 2:
            continue
        lo, hi = by_dk[d_ks[0]], by_dk[d_ks[-1]]
        for when, pick in (("init", at_init(mk.ATTN_SCORE_STD)), ("over training", window_mean(mk.ATTN_SCORE_STD,
                                                                                             OVER_TRAINING))):
            a, b = per_seed(lo, pick), per_seed(hi, pick)
            ratios = {s: b[s] / a[s] for s in a.keys() & b.keys() if a[s] > 0}
            check = seed_check({"part": "score std invariant across d_k", **rest, "d_k": d_ks[-1], "when": when},
                               ratios, lambda v: 1 / INVARIANCE_FACTOR <= v <= INVARIANCE_FACTOR,
                               f"std at d_k={d_ks[-1]} / at d_k={d_ks[0]} within {INVARIANCE_FACTOR:g}x",
                               lambda m: min(m - 1 / INVARIANCE_FACTOR, INVARIANCE_FACTOR - m), lo.runs + hi.runs)
            if check is not None:
                checks.append(check)
                rows.append([context_label({**rest, "d_k": None}), f"{d_ks[-1]} / {d_ks[0]}", when, check.value])
    return checks, rows


def claim(study: Study) -> ClaimResult:
    checks, rows = invariance_checks(study)
    cell_rows = []
    series: dict[str, list] = {}
    for cell in study.claim_cells:
        ctx = context_of(cell, ("model.scale",))
        mode = cell.get("model.scale")
        std = cell_stat(cell, at_init(mk.ATTN_SCORE_STD))
        if std.n:
            series.setdefault(f"{context_label(ctx)} scale={mode}", []).append((ctx["d_k"], std.mean, std.std))
        if mode != "sqrt":
            continue
        runs = cell.runs
        found = [seed_check({"part": "score std near 1 at init", **ctx}, per_seed(cell, at_init(mk.ATTN_SCORE_STD)),
                            lambda v: UNIT_SCALE[0] <= v <= UNIT_SCALE[1], f"in [{UNIT_SCALE[0]}, {UNIT_SCALE[1]}]",
                            lambda m: min(m - UNIT_SCALE[0], UNIT_SCALE[1] - m), runs),
                 seed_check({"part": "softmax not peaked at init", **ctx}, per_seed(cell, at_init(mk.ATTN_MAX_PROB)),
                            lambda v: v < PEAKED_MAX_PROB, f"max prob < {PEAKED_MAX_PROB}",
                            lambda m: PEAKED_MAX_PROB - m, runs)]
        if trained(cell):
            where, values = drop_memorised({"part": "training proceeds", **ctx}, per_seed(cell, run_progress), cell)
            found.append(seed_check(where, values,
                                    lambda v: v >= PROCEEDS_PROGRESS,
                                    f"progress >= {PROCEEDS_PROGRESS} (0 when not finished)",
                                    lambda m: m - PROCEEDS_PROGRESS, runs))
        checks += [c for c in found if c is not None]
        prog = cell_stat(cell, run_progress)
        cell_rows.append([context_label(ctx), ctx["d_k"], str(std), str(cell_stat(cell, at_init(mk.ATTN_MAX_PROB))),
                          str(prog) if trained(cell) else "-", ", ".join(r.status for r in runs)])
    d_ks = sorted({p[0] for pts in series.values() for p in pts})
    paths = []
    if series:
        paths.append(figures.line_panels(study.fig("c5_score_std.png"), [{
            "title": "std of the scores softmax sees, step 0", "xlabel": "d_k", "ylabel": mk.ATTN_SCORE_STD,
            "series": series,
            "refs": [("sqrt(d_k)", d_ks, [math.sqrt(d) for d in d_ks]), ("1", d_ks, [1.0] * len(d_ks))],
            "logx": 2, "logy": True}], n_cols=1))
    tables = [md_table(["where", "d_k", "score std at init", "max prob at init", "progress", "status"], cell_rows)]
    if rows:
        tables.append(md_table(["where", "d_k largest / smallest", "when", "ratio of score std (scaled)"], rows))
    return ClaimResult(
        "C5", "With the divisor, scores stay near unit scale whatever d_k; softmax behaves and training proceeds",
        "for every scaled cell: std of the scaled scores (`attn/score_std`, visible entries) at step 0, mean max "
        "probability at step 0, training progress (as in C4); and the ratio of the score std at the largest d_k "
        "to the smallest (same seed), at step 0 and as the mean over every probe after step 0, per experiment and "
        "per LR of the LR sweep.",
        f"per seed: score std within [{UNIT_SCALE[0]}, {UNIT_SCALE[1]}]; ratio largest/smallest d_k within "
        f"{INVARIANCE_FACTOR:g}x; mean max prob < {PEAKED_MAX_PROB}; finished and progress >= {PROCEEDS_PROGRESS}. "
        "A place passes when >= 2/3 of its seeds pass.",
        checks, tables=tables, figures=paths,
        thresholds={"UNIT_SCALE": UNIT_SCALE, "INVARIANCE_FACTOR": INVARIANCE_FACTOR,
                    "PEAKED_MAX_PROB": PEAKED_MAX_PROB, "PROCEEDS_PROGRESS": PROCEEDS_PROGRESS})


# ---------------------------------------------------------------- the statements (the verdicts)


def c5_unit_scale(c: Cells) -> Statement:
    places = []
    scaled = [x for x in c.training + c.init_only if x.get("model.scale") == "sqrt" and
              (x.kind == INIT_ONLY or is_causal(x))]
    for cell in scaled:
        # at step 0 the initialisation sets the score scale: shown, not counted as evidence
        places.append(Place(where(cell, phase="init"),
                            Effect("scaled score std", seed_values(cell, PHASES["init"](mk.ATTN_SCORE_STD)),
                                   1 / threshold("UNIT"), threshold("UNIT")), by_construction=True))
    for group in groups([x for x in scaled if x.kind != INIT_ONLY], "model.d_k"):
        group = sorted(group, key=lambda x: float(x.get("model.d_k")))
        for cell in group[1:]:
            for phase in ("early", "end"):
                read = PHASES[phase](mk.ATTN_SCORE_STD)
                ratio = paired_values(cell, group[0], read, read, lambda a, b: a / b if b > 0 else None)
                places.append(Place(where(cell, phase=phase, vs=f"d_k {group[0].get('model.d_k')}"),
                                    Effect("score std / the smallest d_k's", ratio, 1 / threshold("UNIT"),
                                           threshold("UNIT"))))
    places = dedupe(places)
    head = next((p for p in sorted(places, key=lambda p: "lr" in p.where)  # a grid's place before an LR sweep's
                 if p.where.get("phase") == "end" and p.where.get("d_k") == max_dk(places)), pick_place(places))
    return Statement("C5a", "with the divisor scores stay near unit scale whatever d_k", places, head,
                     "factor 2 of 1 (init) or of the smallest d_k (over training)")


def c5_proceeds(c: Cells) -> Statement:
    places = []
    for cell in c.training + c.lr_sweep:
        if cell.get("model.scale") != "sqrt" or not is_causal(cell) or cell.get("model.qk_layernorm") is True:
            continue
        prog = progress_of(c.ref(cell))
        lr = lr_text(cell) + ("" if cell.kind == LR_SWEEP else " (grid)")
        place = Place(where(cell, lr=lr), Effect("scaled progress", seed_values(cell, prog), low=threshold("PROCEED")),
                      unmeasurable=no_reference(c.ref(cell)))
        places.append(beside_training_loss(place, c.ref(cell).progress, cell))
    places = dedupe(places)
    head = next((p for p in places if "grid" in str(p.where.get("lr")) and p.where.get("d_k") == max_dk(places)),
                pick_place(places))
    return Statement("C5b", "with the divisor training proceeds at every d_k", places, head,
                     "progress 0.5 (0 = bigram level, 1 = floor or reference run)")


def statements(c: Cells) -> list[Statement]:
    return [c5_unit_scale(c), c5_proceeds(c)]
