"""C4: peaked softmax makes the gradient through it vanish (row instruments, claims.vanish), and training
stalls: decided at each cell's best LR of the LR sweep (bestlr), shown at the grid's LR and at every LR."""

from __future__ import annotations

from pathlib import Path

from andrea_exp.report import figures
from andrea_exp.report.bestlr import best_lr_cells
from andrea_exp.report.cells import Cell
from andrea_exp.report.claims import vanish
from andrea_exp.report.claims.common import (
    ClaimResult,
    context_label,
    context_of,
    floor_of,
    run_progress,
    scale_pairs,
    trained,
)
from andrea_exp.report.effects import (
    PHASES,
    Effect,
    Place,
    log10_ratio,
    paired_values,
    progress_of,
    threshold,
    twins,
)
from andrea_exp.report.memorisation import beside_training_loss, drop_memorised
from andrea_exp.report.rules import Check
from andrea_exp.report.seeds import paired, per_seed, seed_check
from andrea_exp.report.stats import sort_key, stat
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import (
    Cells,
    Statement,
    dedupe,
    is_causal,
    lr_text,
    no_reference,
    pick,
    where,
)
from andrea_exp.runs import metric_keys as mk

STALL_RATIO = 0.5  # "stalls": closes less than half the share of (l_0 - floor) that its scaled twin closes


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


STALL_PART = "training stalls"


def stall_check(where: dict, scaled: Cell, unscaled: Cell, vote: bool) -> Check | None:
    """Per seed: unscaled progress - STALL_RATIO x the scaled twin's progress < 0."""
    values = paired(unscaled, scaled, run_progress, run_progress, lambda u, s: u - STALL_RATIO * s)
    where, values = drop_memorised(where, values, unscaled, scaled)  # a memorised seed is never a stall
    return seed_check(where, values, lambda v: v < 0, f"progress unscaled - {STALL_RATIO} x scaled < 0",
                      lambda m: -m, scaled.runs + unscaled.runs, vote=vote)


def stall_checks(study: Study) -> list[Check]:
    """Voted at each cell's best LR; shown (not voted) at the grid's LR and at every LR tried."""
    checks = []
    best = [b.cell for b in best_lr_cells(study.lr_cells)]
    places = [("best LR", scale_pairs(best, drop=("train.lr",)), True),
              ("grid's LR", [p for p in scale_pairs(study.claim_cells) if trained(p[1]) and trained(p[2])], False),
              ("every LR", scale_pairs(study.lr_cells), False)]
    for at, pairs, vote in places:
        for ctx, scaled, unscaled in pairs:
            lrs = f"{scaled.get('train.lr'):g} / {unscaled.get('train.lr'):g}"
            where = {"part": f"{STALL_PART} (at {at})", **ctx, "lr scaled/unscaled": lrs}
            check = stall_check(where, scaled, unscaled, vote)
            if check is not None:
                checks.append(check)
    return checks


def claim(study: Study) -> ClaimResult:
    pairs = scale_pairs(study.claim_cells)
    checks = []
    for ctx, scaled, unscaled in pairs:
        checks += vanish.vanish_checks("gradient through softmax vanishes", ctx, scaled, unscaled)
    checks += stall_checks(study)
    # the row-gradient curves per d_k are the report's row_gradients.png; 12 tangled ratio series are not drawn
    paths = [p for p in (loss_curves_figure(study),) if p is not None]
    rows = vanish.norm_ratio_rows(pairs)
    prog_rows = [[context_label(ctx), ctx["d_k"], str(stat(map(run_progress, s.runs))),
                  str(stat(map(run_progress, u.runs))), ", ".join(r.status for r in u.runs)]
                 for ctx, s, u in pairs if trained(s) and trained(u)]
    tables = [md_table(vanish.NORM_RATIO_HEADER, rows)] if rows else []
    if prog_rows:
        tables.append(md_table(["where", "d_k", "progress at the grid's LR, scaled", "unscaled", "unscaled status"],
                               prog_rows))
    notes = [] if study.lr_cells else ["No LR sweep among the runs read: 'training stalls' is decided at each "
                                       "cell's best LR, so it is not measured (shown at the grid's LR only); run "
                                       "`andrea-exp -m experiment=lr_sensitivity seed=0,1,2`."]
    return ClaimResult(
        "C4", "Peaked softmax makes gradients vanish elsewhere, and training stalls",
        "for each pair of cells that differ only in the divisor (twins: same d_k, init, LR, seed): the probe's "
        "row instruments (grad/scores_dead_frac, attn/jac_dead_frac, grad/scores_row_p50) at step 0 and over "
        f"{vanish.WINDOW_TEXT}; training progress = (l_0 - final held-out loss) / (l_0 - floor), l_0 the step-0 "
        "training loss, floor the entropy floor (0 when unknown), 0 for runs that did not finish; each cell at "
        "its best LR of the LR sweep (lowest final loss, mean over seeds), and shown at the grid's LR and at "
        "every LR tried. The total norm grad/scores is shown as a ratio over time, not voted.",
        f"'gradient vanishes': {vanish.RULE}. 'training stalls' (voted at the best LR only): per seed, unscaled "
        f"progress < {STALL_RATIO} x its scaled twin's. A place passes when >= 2/3 of its seeds pass.",
        checks, tables=tables, figures=paths, notes=notes,
        thresholds={"DEAD_FRAC_GAP": vanish.DEAD_FRAC_GAP, "VANISH_RATIO": vanish.VANISH_RATIO,
                    "STALL_RATIO": STALL_RATIO, "EARLY_WINDOW": vanish.EARLY_WINDOW})


# ---------------------------------------------------------------- the statements (the verdicts)


def c4_vanish(c: Cells) -> Statement:
    places = []
    for _, scaled, unscaled in twins([x for x in c.training if is_causal(x)], "model.scale", "sqrt", "none"):
        for phase in ("init", "early"):
            read = PHASES[phase](mk.GRAD_SCORES_ROW_P50)
            ratio = Effect("log10(unscaled / scaled median row gradient)",
                           paired_values(unscaled, scaled, read, read, log10_ratio), high=threshold("VANISH"))
            places.append(Place(where(unscaled, phase=phase), ratio))
    places = dedupe(places)
    return Statement("C4a", "peaked softmax makes row gradients vanish", places,
                     pick(places, phase="early"), "scaled twin; log10 ratio -1 (10x smaller)")


def c4_stall(c: Cells) -> Statement:
    places, warnings = [], []
    for _, scaled, unscaled in twins([x for x in c.training if is_causal(x)], "model.scale", "sqrt", "none"):
        prog = progress_of(c.ref(unscaled))
        behind = Effect("scaled - unscaled progress", paired_values(scaled, unscaled, prog, prog, lambda a, b: a - b),
                        low=0.0)  # the stall is the divisor's doing only where the scaled twin got further
        place = Place(where(unscaled, lr=lr_text(unscaled)),
                      Effect("unscaled progress", per_seed(unscaled, prog), high=threshold("STALL")), [behind],
                      unmeasurable=no_reference(c.ref(unscaled)))
        places.append(beside_training_loss(place, c.ref(unscaled).progress, unscaled, scaled))
    for cell, edge in best_lr_cells(c.lr_sweep):
        if cell.get("model.scale") != "none" or cell.get("model.qk_layernorm") is True:
            continue
        prog = progress_of(c.ref(cell))
        place = Place(where(cell, lr=f"best {lr_text(cell)}"),
                      Effect("unscaled progress at its best LR", per_seed(cell, prog), high=threshold("STALL")),
                      unmeasurable=no_reference(c.ref(cell)))
        places.append(beside_training_loss(place, c.ref(cell).progress, cell))
        if edge:
            warnings.append(f"best LR of unscaled d_k {cell.get('model.d_k')} ({lr_text(cell)}) is at the edge of "
                            "the swept range")
    places = dedupe(places)
    head = next((p for p in reversed(places) if str(p.where.get("lr", "")).startswith("best")), pick(places))
    return Statement("C4b", "without the divisor training stalls", places, head,
                     "progress 0.25 (0 = bigram level, 1 = floor or reference run)", notes=warnings)


def statements(c: Cells) -> list[Statement]:
    return [c4_vanish(c), c4_stall(c)]
