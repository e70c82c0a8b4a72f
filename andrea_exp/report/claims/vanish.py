"""'The gradient through softmax vanishes' (C4, C9), on instruments that see rows, not totals.

Each unscaled cell is set against its scaled twin (same d_k, init, LR and seed: paired per seed) on
- the share of dead rows of d loss / d S (grad/scores_dead_frac) and of the softmax Jacobian
  (attn/jac_dead_frac): vanishes when unscaled - scaled >= DEAD_FRAC_GAP;
- the median row gradient ||d loss / d S_i|| (grad/scores_row_p50): vanishes when unscaled / scaled
  <= VANISH_RATIO;
at step 0 and as the mean over the probes in EARLY_WINDOW. The total norm (grad/scores) is shown as a ratio
over time, never voted: one large row can carry a total while most rows are dead.
"""

from __future__ import annotations

from andrea_exp.report.cells import Cell
from andrea_exp.report.claims.common import at_end, at_init, context_label
from andrea_exp.report.rules import Check
from andrea_exp.report.seeds import EARLY_WINDOW, paired, seed_check, window_mean
from andrea_exp.report.stats import stat
from andrea_exp.runs import metric_keys as mk

DEAD_FRAC_GAP = 0.5  # unscaled has at least half of all rows more dead than its scaled twin
VANISH_RATIO = 0.1  # the unscaled median row gradient is at least 10x smaller than the scaled twin's
WINDOW_TEXT = f"steps {EARLY_WINDOW[0]}..{EARLY_WINDOW[1]}"
INSTRUMENTS = (("dead rows of d loss/d S", mk.GRAD_SCORES_DEAD_FRAC, "gap"),
               ("dead rows of the softmax Jacobian", mk.ATTN_JAC_DEAD_FRAC, "gap"),
               ("median row gradient", mk.GRAD_SCORES_ROW_P50, "ratio"))
WHENS = (("init", at_init), (WINDOW_TEXT, window_mean))
RULE = (f"per seed, unscaled against its scaled twin: dead-row share (d loss/d S rows below probe.dead_grad; "
        f"softmax-Jacobian rows below probe.dead_jac) higher by >= {DEAD_FRAC_GAP}, and median row gradient "
        f"<= {VANISH_RATIO} x the twin's; each at step 0 and as the mean over the probes in {WINDOW_TEXT}")


def _ratio(u: float, s: float) -> float | None:
    return u / s if s > 0 else None


def vanish_checks(part: str, ctx: dict, scaled: Cell, unscaled: Cell) -> list[Check]:
    """One check per (instrument, when) for one scaled/unscaled pair."""
    checks = []
    for when, pick in WHENS:
        for name, key, kind in INSTRUMENTS:
            where = {"part": part, **ctx, "instrument": name, "when": when}
            runs = scaled.runs + unscaled.runs
            if kind == "gap":
                values = paired(unscaled, scaled, pick(key), pick(key), lambda u, s: u - s)
                check = seed_check(where, values, lambda v: v >= DEAD_FRAC_GAP, f"unscaled - scaled >= {DEAD_FRAC_GAP}",
                                   lambda m: m - DEAD_FRAC_GAP, runs)
            else:
                values = paired(unscaled, scaled, pick(key), pick(key), _ratio)
                check = seed_check(where, values, lambda v: v <= VANISH_RATIO, f"unscaled / scaled <= {VANISH_RATIO}",
                                   lambda m: VANISH_RATIO - m, runs)
            if check is not None:
                checks.append(check)
    return checks


def norm_ratio_rows(pairs) -> list[list]:
    """The total norm's ratio unscaled / scaled (per seed, then over seeds): at init, early window, end."""
    rows = []
    for ctx, scaled, unscaled in pairs:
        cols = [str(stat(paired(unscaled, scaled, f(mk.GRAD_SCORES), f(mk.GRAD_SCORES), _ratio).values()))
                for f in (at_init, window_mean, at_end)]
        rows.append([context_label(ctx), ctx["d_k"], *cols])
    return rows


NORM_RATIO_HEADER = ["where", "d_k", "grad/scores ratio unscaled/scaled at init", f"mean over {WINDOW_TEXT}",
                     "at the last probe"]


def _ratio_curve(scaled: Cell, unscaled: Cell) -> list[tuple]:
    """(step, mean ratio, std) at the steps both twins of a seed probed."""
    per_step: dict[int, list[float]] = {}
    by_seed = {r.seed: r for r in scaled.runs}
    for run in unscaled.runs:
        twin = by_seed.get(run.seed)
        if twin is None:
            continue
        s_vals = dict(zip(*twin.series(mk.GRAD_SCORES)))
        for step, u in zip(*run.series(mk.GRAD_SCORES)):
            if s_vals.get(step, 0) > 0:
                per_step.setdefault(step, []).append(u / s_vals[step])
    return [(s, stat(v).mean, stat(v).std) for s, v in sorted(per_step.items())]
