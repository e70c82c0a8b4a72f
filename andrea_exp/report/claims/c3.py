"""C3: without the divisor softmax becomes peaked (max probability, entropy, saturated rows), scaled vs unscaled."""

from __future__ import annotations

from andrea_exp import metric_keys as mk
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
from andrea_exp.report.rules import Check, verdict
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table

# the synthetic rows' names -> the probe's keys
PEAK_KEYS = {"max_prob": mk.ATTN_MAX_PROB, "entropy_norm": mk.ATTN_ENTROPY_NORM,
             "saturated_frac": mk.ATTN_SATURATED_FRAC}


def _peak_stats(cell: Cell, when: str) -> dict:
    pick = at_init if when == "init" else at_end
    return {k: cell_stat(cell, pick(key)) for k, key in PEAK_KEYS.items()}


def claim(study: Study) -> ClaimResult:
    checks, rows = [], []
    by_dk = {}
    for r in study.synthetic:
        by_dk.setdefault(r["d_k"], {})[r["scale"]] = r
    for d_k, pair in sorted(by_dk.items()):
        ok = pair["none"]["max_prob"] >= PEAKED_MAX_PROB and pair["none"]["max_prob"] > pair["sqrt"]["max_prob"]
        checks.append(Check({"source": "synthetic", "d_k": d_k, "when": "init"}, ok,
                            value=f"{pair['none']['max_prob']:.3g} (scaled {pair['sqrt']['max_prob']:.3g})",
                            threshold=f">= {PEAKED_MAX_PROB} and > scaled"))
        rows.append(["synthetic (random unit-variance q, k; T=64)", d_k, "init", pair["sqrt"]["max_prob"],
                     pair["none"]["max_prob"], pair["sqrt"]["entropy_norm"], pair["none"]["entropy_norm"],
                     pair["sqrt"]["saturated_frac"], pair["none"]["saturated_frac"]])
    panels = {(k, w): {} for k in ("entropy_norm", "max_prob") for w in ("init", "end")}
    for k in ("entropy_norm", "max_prob"):
        for mode in ("sqrt", "none"):
            panels[(k, "init")][f"synthetic scale={mode}"] = [(d, by_dk[d][mode][k], 0.0) for d in by_dk]
    for ctx, scaled, unscaled in scale_pairs(study.claim_cells):
        for when in ("init", "end"):
            s, u = _peak_stats(scaled, when), _peak_stats(unscaled, when)
            if u["max_prob"].n == 0 or s["max_prob"].n == 0:
                continue
            ok = u["max_prob"].mean >= PEAKED_MAX_PROB and u["max_prob"].mean > s["max_prob"].mean
            checks.append(Check({"source": "model", **ctx, "when": when}, ok,
                                value=f"{u['max_prob']} (scaled {s['max_prob'].mean:.3g})",
                                threshold=f">= {PEAKED_MAX_PROB} and > scaled"))
            rows.append([context_label(ctx), ctx["d_k"], when, str(s["max_prob"]), str(u["max_prob"]),
                         str(s["entropy_norm"]), str(u["entropy_norm"]), str(s["saturated_frac"]),
                         str(u["saturated_frac"])])
            for k in ("entropy_norm", "max_prob"):
                for mode, st in (("sqrt", s), ("none", u)):
                    label = f"{context_label(ctx)} scale={mode}"
                    panels[(k, when)].setdefault(label, []).append((ctx["d_k"], st[k].mean, st[k].std))
    path = figures.line_panels(study.fig("c3_peakiness.png"), [
        {"title": f"{k} at {'step 0' if w == 'init' else 'the end'}", "xlabel": "d_k", "ylabel": k,
         "series": series, "logx": 2} for (k, w), series in panels.items()])
    header = ["where", "d_k", "when", "max prob, scaled", "max prob, unscaled", "entropy/log n, scaled",
              "entropy/log n, unscaled", "saturated rows, scaled", "saturated rows, unscaled"]
    return ClaimResult(
        "C3", "Without the 1/sqrt(d_k) divisor softmax becomes peaked: one position dominates each row",
        "mean over rows of the largest attention probability, normalised entropy (entropy / log of visible keys) "
        "and the share of rows with max prob > 0.99, scaled vs unscaled, per d_k: for random unit-variance q, k "
        "(synthetic, T=64, causal) and for the models' probe batch at step 0 and at the last probe.",
        f"passes at a place when the unscaled mean max prob is >= {PEAKED_MAX_PROB} (one position carries more "
        "than half of the row) and above the scaled one.",
        checks, verdict(checks), tables=[md_table(header, rows)], figures=[path])
