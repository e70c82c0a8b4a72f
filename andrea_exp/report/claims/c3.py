"""C3: without the divisor softmax becomes peaked (max probability, entropy, saturated rows), scaled vs unscaled.

Voted at init only, and only where the claim's premise holds: raw (unscaled) scores with std >= RAW_STD_PREMISE.
Where it does not (e.g. small-std q/k inits), the place is shown and not measured. End of training is shown."""

from __future__ import annotations

import math

from andrea_exp.report import figures
from andrea_exp.report.cells import INIT_ONLY, Cell
from andrea_exp.report.claims.common import (
    PEAKED_MAX_PROB,
    ClaimResult,
    at_end,
    at_init,
    cell_stat,
    context_label,
    scale_pairs,
)
from andrea_exp.report.effects import PHASES, Effect, Place, paired_values, threshold, twins
from andrea_exp.report.rules import Check
from andrea_exp.report.seeds import paired, per_seed, seed_check
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import (
    Cells,
    Statement,
    dedupe,
    is_causal,
    phases_of,
    pick,
    where,
)
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
        checks, tables=[md_table(header, rows)], figures=[path],
        thresholds={"RAW_STD_PREMISE": RAW_STD_PREMISE, "PEAKED_MAX_PROB": PEAKED_MAX_PROB})


# ---------------------------------------------------------------- the statements (the verdicts)


def c3_peaked(c: Cells) -> Statement:
    places = []
    for _, scaled, unscaled in twins([x for x in c.training + c.init_only if x.kind == INIT_ONLY or is_causal(x)],
                                     "model.scale", "sqrt", "none"):
        for phase in phases_of(unscaled):
            read = PHASES[phase](mk.ATTN_MAX_PROB)
            peak = Effect("unscaled mean max probability", per_seed(unscaled, read), low=threshold("PEAKED"))
            diff = Effect("unscaled - scaled max probability", paired_values(unscaled, scaled, read, read,
                                                                             lambda a, b: a - b), low=0.0)
            # at step 0 the initialisation sets the score scale: shown, not counted as evidence
            places.append(Place(where(unscaled, phase=phase), peak, [diff], by_construction=phase == "init"))
    places = dedupe(places)
    head = pick(places, phase="init")
    head = pick([p for p in places if p.votes], phase="end") or head
    return Statement("C3", "without the divisor softmax becomes peaked", places, head,
                     f"max prob {threshold('PEAKED')} (and above the scaled twin)", notes=[crossover(c)])


def crossover(c: Cells) -> str:
    """Where the mean max probability at init crosses 0.5, against the score std (all cells, all inits)."""
    points = []
    for cell in c.training + c.init_only:
        std = per_seed(cell, PHASES["init"](mk.ATTN_SCORE_STD))
        prob = per_seed(cell, PHASES["init"](mk.ATTN_MAX_PROB))
        if std and prob:
            points.append((sum(std.values()) / len(std), sum(prob.values()) / len(prob)))
    points.sort()
    for (s0, p0), (s1, p1) in zip(points, points[1:]):
        if p0 < threshold("PEAKED") <= p1 and s0 > 0 and s1 > 0:
            t = (threshold("PEAKED") - p0) / (p1 - p0)
            return (f"max prob crosses {threshold('PEAKED')} at score std about "
                    f"{math.exp(math.log(s0) + t * (math.log(s1) - math.log(s0))):.2g} (step 0, every init and d_k)")
    return "no crossing of max prob 0.5 among the cells at step 0"


def statements(c: Cells) -> list[Statement]:
    return [c3_peaked(c)]
