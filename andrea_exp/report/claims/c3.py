"""C3: without the divisor softmax becomes peaked (max probability, entropy, saturated rows), scaled vs unscaled.

Voted at init only, and only where the claim's premise holds: raw (unscaled) scores with std >= RAW_STD_PREMISE.
Where it does not (e.g. small-std q/k inits), the place is shown and not measured. End of training is shown."""

from __future__ import annotations

from andrea_exp.report import figures
from andrea_exp.report.cells import Cell
from andrea_exp.report.claims.common import (
    PEAKED_MAX_PROB,
    ClaimResult,
    at_end,
    at_init,
    cell_stat,
    context_label,
    scale_pairs,
)
from andrea_exp.report.rules import CONDITIONAL, HOLDS, NOT_MEASURED, Check, Verdict, places, verdict
from andrea_exp.report.seeds import paired, seed_check
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.runs import metric_keys as mk

RAW_STD_PREMISE = 4.0  # the claim needs raw scores with std >> 1: std of the unscaled scores at init >= 4
PREMISE = f"unscaled score std at init >= {RAW_STD_PREMISE:g}"
# the synthetic rows' names -> the probe's keys
PEAK_KEYS = {"max_prob": mk.ATTN_MAX_PROB, "entropy_norm": mk.ATTN_ENTROPY_NORM,
             "saturated_frac": mk.ATTN_SATURATED_FRAC}
PEAK_TEST = f"min(unscaled - {PEAKED_MAX_PROB}, unscaled - scaled) of the max prob >= 0"


def _peak_stats(cell: Cell, when: str) -> dict:
    pick = at_init if when == "init" else at_end
    return {k: cell_stat(cell, pick(key)) for k, key in PEAK_KEYS.items()}


def peak_check(where: dict, values: dict, premise_met: bool, runs=(), vote: bool = True) -> Check | None:
    """values: seed -> min(u - PEAKED_MAX_PROB, u - scaled twin), u the unscaled mean max prob."""
    where = {**where, "premise": "met" if premise_met else "not met"}
    return seed_check(where, values, lambda v: v >= 0, PEAK_TEST, lambda m: m, runs, vote=vote and premise_met)


def premise_verdict(checks: list[Check]) -> Verdict:
    """The verdict over places where the premise holds; places without it are named as not measured."""
    unmet = [c for c in checks if c.where.get("premise") == "not met" and c.where.get("when") == "init"]
    base = verdict(checks, f"the premise ({PREMISE}) holds at no place measured")
    if base.verdict == NOT_MEASURED or not unmet:
        return base
    bare = [Check({k: v for k, v in c.where.items() if k not in ("premise", "when")}, c.ok) for c in unmet]
    text = f"premise ({PREMISE}) not met, so not measured, at {places(bare)}"
    if base.verdict == HOLDS:
        return Verdict(CONDITIONAL, f"where {PREMISE}; {text}")
    return Verdict(base.verdict, f"{base.condition}; {text}" if base.condition else text)


def claim(study: Study) -> ClaimResult:
    checks, rows = [], []
    by_dk = {}
    for r in study.synthetic:
        by_dk.setdefault(r["d_k"], {})[r["scale"]] = r
    for d_k, pair in sorted(by_dk.items()):
        u, s = pair["none"]["max_prob"], pair["sqrt"]["max_prob"]
        checks.append(peak_check({"source": "synthetic", "d_k": d_k, "when": "init"},
                                 {"-": min(u - PEAKED_MAX_PROB, u - s)}, d_k ** 0.5 >= RAW_STD_PREMISE))
        rows.append(["synthetic (random unit-variance q, k; T=64)", d_k, "init", d_k ** 0.5, s, u,
                     pair["sqrt"]["entropy_norm"], pair["none"]["entropy_norm"],
                     pair["sqrt"]["saturated_frac"], pair["none"]["saturated_frac"]])
    panels = {(k, w): {} for k in ("entropy_norm", "max_prob") for w in ("init", "end")}
    for k in ("entropy_norm", "max_prob"):
        for mode in ("sqrt", "none"):
            panels[(k, "init")][f"synthetic scale={mode}"] = [(d, by_dk[d][mode][k], 0.0) for d in by_dk]
    for ctx, scaled, unscaled in scale_pairs(study.claim_cells):
        raw = cell_stat(unscaled, at_init(mk.ATTN_SCORE_STD))
        met = raw.n > 0 and raw.mean >= RAW_STD_PREMISE
        for when in ("init", "end"):
            s, u = _peak_stats(scaled, when), _peak_stats(unscaled, when)
            pick = at_init(mk.ATTN_MAX_PROB) if when == "init" else at_end(mk.ATTN_MAX_PROB)
            values = paired(unscaled, scaled, pick, pick, lambda a, b: min(a - PEAKED_MAX_PROB, a - b))
            check = peak_check({"source": "model", **ctx, "when": when}, values, met, scaled.runs + unscaled.runs,
                               vote=when == "init")
            if check is None:
                continue
            checks.append(check)
            rows.append([context_label(ctx), ctx["d_k"], when, str(raw), str(s["max_prob"]), str(u["max_prob"]),
                         str(s["entropy_norm"]), str(u["entropy_norm"]), str(s["saturated_frac"]),
                         str(u["saturated_frac"])])
            for k in ("entropy_norm", "max_prob"):
                for mode, st in (("sqrt", s), ("none", u)):
                    label = f"{context_label(ctx)} scale={mode}"
                    panels[(k, when)].setdefault(label, []).append((ctx["d_k"], st[k].mean, st[k].std))
    path = figures.line_panels(study.fig("c3_peakiness.png"), [
        {"title": f"{k} at {'step 0' if w == 'init' else 'the end (shown, not voted)'}", "xlabel": "d_k",
         "ylabel": k, "series": series, "logx": 2} for (k, w), series in panels.items()])
    header = ["where", "d_k", "when", "unscaled score std at init (premise)", "max prob, scaled", "max prob, unscaled",
              "entropy/log n, scaled", "entropy/log n, unscaled", "saturated rows, scaled", "saturated rows, unscaled"]
    return ClaimResult(
        "C3", "Without the 1/sqrt(d_k) divisor softmax becomes peaked: one position dominates each row",
        "mean over rows of the largest attention probability, normalised entropy (entropy / log of visible keys) "
        "and the share of rows with max prob > 0.99, scaled vs unscaled twins, per d_k: for random unit-variance "
        "q, k (synthetic, T=64, causal; raw std sqrt(d_k)) and for the models' probe batch at step 0; at the last "
        "probe shown, not voted (training changes q, k: that is no longer the claim's setting).",
        f"premise: {PREMISE} (mean over seeds); where it is not met the place is not measured. Where it is: per "
        f"seed, the unscaled mean max prob >= {PEAKED_MAX_PROB} and above its scaled twin's; a place passes when "
        ">= 2/3 of its seeds pass.",
        checks, premise_verdict(checks), tables=[md_table(header, rows)], figures=[path],
        thresholds={"RAW_STD_PREMISE": RAW_STD_PREMISE, "PEAKED_MAX_PROB": PEAKED_MAX_PROB})
