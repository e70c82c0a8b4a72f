"""Section "Every fix at every d_k": the `stability_fixes` experiment (conf/fix/: the divisor 1/sqrt(d_k), none,
1/d_k, QK-LayerNorm, soft-capping, sigma-reparam, z-loss; d_k 64, 256, 4096; one LR set; seeds).

Per (fix, d_k): the LR sensitivity (growth.sensitivity: lr.lr_sensitivity per seed, then over seeds) and the best
LR (bestlr.best_lr). Two named rules:

- TRANSFER_RULE: a fix's best LR transfers across d_k when the best LRs of the d_k that vote lie within
  TRANSFER_STEPS steps of the LR grid of each other. A d_k votes when its best LR is bracketed (an LR below and one
  above it ran: a best LR at the sweep's edge may lie beyond it) and some LR trains it (else its best LR is the
  least bad of failures). Fewer than two voting d_k: not measured.
- OUTPUT_SIDE_RULE: a run that does not train (effects.trains, one seed) failed on the attention side when its
  largest attention logit (report.largest) exceeded ATTN_LARGE at some step, on the output side when it did not but
  its largest output logit (train/out_logit_max) reached OUT_LARGE, else on neither; not measured where either
  series is missing. z-loss removes a fix's output-side failures when the fix has some with z-loss off and its
  z-loss twin (the same fix with train.z_loss > 0) none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from andrea_exp.report import bestlr
from andrea_exp.report.bestlr import capped_final
from andrea_exp.report.cells import LR, Cell
from andrea_exp.report.effects import References, references, trains, trains_rule
from andrea_exp.report.fix_label import fix_label, lr_cells, without_z_loss
from andrea_exp.report.growth import sensitivity
from andrea_exp.report.largest import logit_key, logit_label
from andrea_exp.report.runs import Run
from andrea_exp.report.stats import stat
from andrea_exp.report.table import md_table
from andrea_exp.runs import metric_keys as mk

EXPERIMENT = "stability_fixes"
TRANSFER_STEPS = 1  # the grid's LRs are a factor of about 5 apart: one step is the grid's resolution
ATTN_LARGE = 100.0  # about 4 at init; attention-side failures reach 1e3-1e6 (the committed growth study)
OUT_LARGE = 100.0  # an output logit of 100: a softmax ratio of e^100 between two tokens
TRANSFER_RULE = (f"the best LR transfers across d_k: the best LRs of the d_k that vote lie within {TRANSFER_STEPS} "
                 "step(s) of the LR grid of each other; a d_k votes when its best LR is bracketed (not the smallest "
                 "or largest LR it ran) and some LR trains it; fewer than two voting d_k: not measured")
OUTPUT_SIDE_RULE = (f"a run that does not train failed on the attention side when its largest attention logit "
                    f"exceeded {ATTN_LARGE:g}, on the output side when it did not but its largest output logit "
                    f"(`{mk.TRAIN_OUT_LOGIT_MAX}`) reached {OUT_LARGE:g}, else on neither; not measured where "
                    "either was not logged")
TRAINS, ATTENTION, OUTPUT, NEITHER, NOT_MEASURED = "trains", "attention side", "output side", "neither", "not measured"


def grouped(cells: list[Cell]) -> dict[tuple, dict[float, Cell]]:
    """(fix, d_k) -> lr -> cell, for the stability_fixes experiment's cells (pooled with others or not)."""
    return lr_cells(cells, EXPERIMENT, lambda cell: (fix_label(cell), cell.get("model.d_k")))


# ------------------------------------------------------------------ the best LR and its transfer
@dataclass(frozen=True)
class BestLR:
    lr: float | None
    votes: bool
    why: str  # "bracketed", or why it does not vote


def best_lr(by_lr: dict[float, Cell], refs: References) -> BestLR:
    """The best LR of one (fix, d_k) (bestlr.best_lr: lowest mean capped final loss, ties to the smaller LR), which
    votes when bracketed: three LRs or more and the best at neither edge."""
    cells = [by_lr[lr] for lr in sorted(by_lr) if by_lr[lr].runs]
    if not cells:
        return BestLR(None, False, "no runs")
    best = bestlr.best_lr(cells)
    if best is None:
        return BestLR(None, False, "no known loss")
    lr = float(best.cell.get(LR))
    if not any(trains(c.runs, refs) for c in cells):
        return BestLR(lr, False, "never trains")
    if best.at_edge or len(cells) < 3:
        return BestLR(lr, False, "at the sweep's edge: not bracketed")
    return BestLR(lr, True, "bracketed")


@dataclass(frozen=True)
class Transfer:
    verdict: str  # "transfers", "does not transfer", NOT_MEASURED
    why: str


def transfer(best: dict, grid: list[float]) -> Transfer:
    """TRANSFER_RULE over one fix's best LR per d_k (d_k -> BestLR); grid: the LRs, sorted."""
    voting = {d_k: b.lr for d_k, b in best.items() if b.votes}
    silent = [f"d_k {d_k}: {b.why}" for d_k, b in best.items() if not b.votes]
    rest = f"; does not vote: {', '.join(silent)}" if silent else ""
    if len(voting) < 2:
        return Transfer(NOT_MEASURED, f"fewer than two d_k with a bracketed best LR{rest}")
    steps = [min(range(len(grid)), key=lambda i: abs(math.log(grid[i] / lr))) for lr in voting.values()]
    spread = max(steps) - min(steps)
    where = ", ".join(f"{lr:g} at d_k {d_k}" for d_k, lr in voting.items())
    ok = spread <= TRANSFER_STEPS
    return Transfer("transfers" if ok else "does not transfer",
                    f"best LR {where}: {spread} grid step(s) apart ({'<=' if ok else '>'} {TRANSFER_STEPS}){rest}")


# ------------------------------------------------------------------ which side a failure is on
def largest(run: Run, key: str) -> float | None:
    """The largest value a run logged of key over training (inf counts; NaN does not); None: never logged."""
    values = [v for v in run.series(key)[1] if not math.isnan(v)]
    return max(values) if values else None


def failure_side(run: Run, refs: References, attn_key: str) -> str:
    """OUTPUT_SIDE_RULE on one run."""
    if trains([run], refs):
        return TRAINS
    attn, out = largest(run, attn_key), largest(run, mk.TRAIN_OUT_LOGIT_MAX)
    if attn is None or out is None:
        return NOT_MEASURED
    if attn > ATTN_LARGE:
        return ATTENTION
    return OUTPUT if out >= OUT_LARGE else NEITHER


@dataclass
class Sides:
    counts: dict  # side -> runs
    output_at: dict  # (d_k, lr) -> output-side runs there
    measured: int  # runs that could be read (not NOT_MEASURED)


def sides(groups: dict, fix: str, refs: References, attn_key: str) -> Sides:
    counts: dict = {}
    output_at: dict = {}
    for (f, d_k), by_lr in groups.items():
        if f != fix:
            continue
        for lr, cell in sorted(by_lr.items()):
            for run in cell.runs:
                side = failure_side(run, refs, attn_key)
                counts[side] = counts.get(side, 0) + 1
                if side == OUTPUT:
                    output_at[(d_k, lr)] = output_at.get((d_k, lr), 0) + 1
    return Sides(counts, output_at, sum(n for s, n in counts.items() if s != NOT_MEASURED))


def z_loss_statement(fix: str, off: Sides | None, on: Sides) -> str:
    """Whether z-loss removes the output-side failures of `fix` (its twin without z-loss: `off`)."""
    twin = without_z_loss(fix)
    if off is None or not off.measured:
        return f"z-loss on `{twin}`: **not measured** (no run of `{twin}` without z-loss)"
    unread = {name: s.counts.get(NOT_MEASURED, 0) for name, s in ((twin, off), (fix, on))}
    if any(unread.values()):  # a failed run that cannot be read might be an output-side failure
        return (f"z-loss on `{twin}`: **not measured** (failed runs whose attention or output logits were not "
                f"logged: {', '.join(f'{n} of `{name}`' for name, n in unread.items())})")
    n_off, n_on = off.counts.get(OUTPUT, 0), on.counts.get(OUTPUT, 0)
    numbers = (f"{n_off} of {off.measured} runs fail on the output side with z-loss off, {n_on} of {on.measured} "
               f"with `{fix}`")
    if n_on:
        return f"z-loss on `{twin}`: **does not remove** the output-side failures: {numbers}"
    if n_off:
        return f"z-loss on `{twin}`: **removes** the output-side failures: {numbers}"
    return f"z-loss on `{twin}`: **nothing to remove**: {numbers}"


# ------------------------------------------------------------------ the section
def fixes_section(cells: list[Cell], refs: dict[str, References] | None = None) -> str:
    groups = grouped(cells)
    intro = ("## Every fix at every d_k\n\n"
             f"The `{EXPERIMENT}` experiment (`experiments/stability_fixes.sh`): each fix of `conf/fix/` at each d_k "
             "over one LR set. LR sensitivity as in the LR section (per seed, then over seeds, over the LRs every "
             f"row ran); best LR: the lowest final loss, mean over seeds, a run that diverged at l_0. Rules: "
             f"{TRANSFER_RULE}; {OUTPUT_SIDE_RULE}.\n\n")
    if not groups:
        return intro + (f"**not measured**: no `{EXPERIMENT}` runs among the runs read; run "
                        "`experiments/stability_fixes.sh` and pass its sweep directory.\n")
    label = next(c.experiment for by_lr in groups.values() for c in by_lr.values())
    ref = (refs or {}).get(label) or references([c for by_lr in groups.values() for c in by_lr.values()])
    grid = sorted({lr for by_lr in groups.values() for lr in by_lr})
    shared = sorted(set.intersection(*(set(by_lr) for by_lr in groups.values())))
    rows, best = [], {}
    for (fix, d_k), by_lr in groups.items():
        b = best[(fix, d_k)] = best_lr(by_lr, ref)
        good = [lr for lr, c in sorted(by_lr.items()) if trains(c.runs, ref)]
        value = str(sensitivity(by_lr, shared))
        if not good:
            value = f"never trains: not ranked ({value})"
        losses = [f"{stat(map(capped_final, by_lr[lr].runs)).mean:.3f}" if lr in by_lr else "-" for lr in grid]
        rows.append([fix, d_k, *losses, ", ".join(f"{lr:g}" for lr in good) or "none",
                     "-" if b.lr is None else f"{b.lr:g} ({b.why})", value])
    table = md_table(["fix", "d_k", *[f"loss at lr={lr:g}" for lr in grid], "LRs that train", "best LR",
                      f"LR sensitivity over lr {', '.join(f'{lr:g}' for lr in shared)}"], rows)
    fixes = sorted({fix for fix, _ in groups})
    d_ks = sorted({d_k for _, d_k in groups})
    transfer_rows = []
    for fix in fixes:
        per_dk = {d_k: best[(fix, d_k)] for d_k in d_ks if (fix, d_k) in best}
        t = transfer(per_dk, grid)
        transfer_rows.append([fix, *[f"{per_dk[d].lr:g}" if d in per_dk and per_dk[d].lr is not None else "-"
                                     for d in d_ks], f"**{t.verdict}**: {t.why}"])
    transfer_table = md_table(["fix", *[f"best LR, d_k {d}" for d in d_ks], "the best LR transfers across d_k"],
                              transfer_rows)
    attn_key = logit_key(run for by_lr in groups.values() for c in by_lr.values() for run in c.runs)
    by_fix = {fix: sides(groups, fix, ref, attn_key) for fix in fixes}
    side_rows = [[fix, s.measured, *[s.counts.get(k, 0) for k in (TRAINS, ATTENTION, OUTPUT, NEITHER, NOT_MEASURED)],
                  ", ".join(f"d_k {d} lr {lr:g}: {n}" for (d, lr), n in sorted(s.output_at.items())) or "-"]
                 for fix, s in by_fix.items()]
    side_table = md_table(["fix", "runs read", "train", "fail: attention side", "fail: output side",
                           "fail: neither", "not measured", "output-side failures at"], side_rows)
    z_fixes = [fix for fix in fixes if fix != without_z_loss(fix)]
    z_lines = [f"- {z_loss_statement(fix, by_fix.get(without_z_loss(fix)), by_fix[fix])}" for fix in z_fixes]
    if not z_lines:
        z_lines = ["- z-loss: **not measured**: no run among these set train.z_loss"]
    return (intro + table + "\n\nThe best LR per d_k and whether it transfers (muP: 1/d_k's should, 1/sqrt(d_k)'s "
            "need not):\n\n" + transfer_table + f"\n\nWhere the runs that do not train fail, with the "
            f"{logit_label(attn_key)} and the largest output logit; an LR trains a run when it ends with "
            f"{trains_rule(ref)}:\n\n" + side_table + "\n\n" + "\n".join(z_lines) + "\n")
