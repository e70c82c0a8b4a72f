"""C9: large d_k pushes softmax into regions of tiny gradient; the divisor counteracts it (Vaswani et al. 2017).
Judged on row instruments (claims.vanish): the median row gradient and dead-row shares, not the total norm."""

from __future__ import annotations

from andrea_exp.report.cells import Cell
from andrea_exp.report.claims import vanish
from andrea_exp.report.claims.common import (
    ClaimResult,
    at_init,
    context_label,
    scale_pairs,
)
from andrea_exp.report.effects import PHASES, Effect, Place, groups, log10_ratio, paired_values, threshold
from andrea_exp.report.rules import Check
from andrea_exp.report.seeds import per_seed, seed_check
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import (
    Cells,
    Statement,
    is_causal,
    where,
)
from andrea_exp.runs import metric_keys as mk

C9_FALL_RATIO = 0.5  # unscaled median row gradient at the largest d_k <= half of that at the smallest
C9_FLAT_FACTOR = 2.0  # scaled median row gradient within 2x across d_k
PART_TINY = "unscaled rows' gradient tiny against the scaled twin"
PART_FALLS = "unscaled row gradient falls as d_k grows"
PART_FLAT = "the divisor keeps the row gradient flat across d_k"


def _trend_checks(where: dict, lo: dict, hi: dict, lo_s: dict, his_s: dict, runs=()) -> list[Check]:
    """lo/hi: seed -> unscaled median row gradient at the smallest / largest d_k; lo_s/his_s the same scaled."""
    falls = {s: hi[s] / lo[s] for s in lo.keys() & hi.keys() if lo[s] > 0}
    flat = {s: his_s[s] / lo_s[s] for s in lo_s.keys() & his_s.keys() if lo_s[s] > 0}
    out = [seed_check({"part": PART_FALLS, **where}, falls, lambda v: v <= C9_FALL_RATIO,
                      f"largest / smallest d_k <= {C9_FALL_RATIO}", lambda m: C9_FALL_RATIO - m, runs),
           seed_check({"part": PART_FLAT, **where}, flat, lambda v: 1 / C9_FLAT_FACTOR <= v <= C9_FLAT_FACTOR,
                      f"largest / smallest d_k within {C9_FLAT_FACTOR:g}x",
                      lambda m: min(m - 1 / C9_FLAT_FACTOR, C9_FLAT_FACTOR - m), runs)]
    return [c for c in out if c is not None]


def synthetic_checks(synthetic: list[dict]) -> tuple[list[Check], list[list]]:
    points: dict = {}
    for r in synthetic:
        points.setdefault(r["d_k"], {})[r["scale"]] = r
    checks, rows = [], []
    for d_k, p in sorted(points.items()):
        ratio = p["none"]["grad_row_p50"] / p["sqrt"]["grad_row_p50"]
        checks.append(seed_check({"part": PART_TINY, "source": "synthetic", "d_k": d_k}, {"-": ratio},
                                 lambda v: v <= vanish.VANISH_RATIO, f"unscaled / scaled <= {vanish.VANISH_RATIO}",
                                 lambda m: vanish.VANISH_RATIO - m))
        rows.append(["synthetic (random unit-variance q, k; T=64)", d_k, p["sqrt"]["grad_row_p50"],
                     p["none"]["grad_row_p50"], ratio, p["none"]["grad_scores"] / p["sqrt"]["grad_scores"]])
    d_ks = sorted(points)
    if len(d_ks) >= 2:
        lo, hi = points[d_ks[0]], points[d_ks[-1]]
        checks += _trend_checks({"source": "synthetic", "d_k": d_ks[-1]}, {"-": lo["none"]["grad_row_p50"]},
                                {"-": hi["none"]["grad_row_p50"]}, {"-": lo["sqrt"]["grad_row_p50"]},
                                {"-": hi["sqrt"]["grad_row_p50"]})
    return checks, rows


def claim(study: Study) -> ClaimResult:
    checks, rows = synthetic_checks(study.synthetic)
    pairs = scale_pairs(study.claim_cells)
    contexts: dict[str, tuple[dict, dict]] = {}
    for ctx, scaled, unscaled in pairs:
        checks += vanish.vanish_checks(PART_TINY, {"source": "model", **ctx}, scaled, unscaled)
        rest = {k: v for k, v in ctx.items() if k != "d_k"}
        contexts.setdefault(context_label(ctx), (rest, {}))[1][ctx["d_k"]] = (scaled, unscaled)
    for rest, by_dk in contexts.values():
        d_ks = sorted(by_dk)
        if len(d_ks) < 2:
            continue
        (s_lo, u_lo), (s_hi, u_hi) = by_dk[d_ks[0]], by_dk[d_ks[-1]]
        p50 = at_init(mk.GRAD_SCORES_ROW_P50)
        checks += _trend_checks({"source": "model", **rest, "d_k": d_ks[-1]}, per_seed(u_lo, p50), per_seed(u_hi, p50),
                                per_seed(s_lo, p50), per_seed(s_hi, p50), s_lo.runs + s_hi.runs + u_lo.runs + u_hi.runs)
    header = ["source", "d_k", "median row |d loss/d S_i|, scaled", "unscaled", "ratio", "total-norm ratio (shown)"]
    tables = [md_table(header, rows)]
    ratio_rows = vanish.norm_ratio_rows(pairs)
    if ratio_rows:
        tables.append(md_table(vanish.NORM_RATIO_HEADER, ratio_rows))
    return ClaimResult(
        "C9", "For large d_k dot products push softmax into regions of tiny gradient; the divisor counteracts it",
        "the gradient through softmax per query row, scaled vs unscaled: for random unit-variance q, k with a fixed "
        "random upstream gradient (synthetic, T=64, d_k 16..4096; median over rows of ||d loss / d S_i||) and for "
        f"the models' probe (row instruments at step 0 and over {vanish.WINDOW_TEXT}). The total norm "
        "(`grad/scores`) is shown, not voted.",
        f"per d_k: {vanish.RULE}; per source: the unscaled median row gradient at the largest d_k <= "
        f"{C9_FALL_RATIO} x at the smallest (step 0), and the scaled one within a factor {C9_FLAT_FACTOR:g}. "
        "Synthetic rows are one sample; a model place passes when >= 2/3 of its seeds pass.",
        checks, tables=tables, figures=[],
        thresholds={"VANISH_RATIO": vanish.VANISH_RATIO, "DEAD_FRAC_GAP": vanish.DEAD_FRAC_GAP,
                    "C9_FALL_RATIO": C9_FALL_RATIO, "C9_FLAT_FACTOR": C9_FLAT_FACTOR})


# ---------------------------------------------------------------- the statements (the verdicts)


def c9_flat(c: Cells) -> Statement:
    places = []
    trained = [x for x in c.training if is_causal(x)]
    for group in groups(trained, "model.d_k", "model.scale"):
        modes: dict[str, list[Cell]] = {}
        for cell in group:
            modes.setdefault(cell.get("model.scale"), []).append(cell)
        if "sqrt" not in modes or "none" not in modes:
            continue
        for phase in ("init", "early", "end"):
            read = PHASES[phase](mk.GRAD_SCORES_ROW_P50)
            drops, spans, zeros = {}, {}, {}
            for mode, cells in modes.items():
                cells = sorted(cells, key=lambda x: float(x.get("model.d_k")))
                if len(cells) > 1:
                    drops[mode] = paired_values(cells[-1], cells[0], read, read, log10_ratio)
                    spans[mode] = f"{cells[0].get('model.d_k')}->{cells[-1].get('model.d_k')}"
                    zeros[mode] = paired_values(cells[-1], cells[0], read, read, lambda a, b: a == 0 and b == 0)
            if len(drops) < 2:
                continue
            unscaled = Effect("log10 change of the unscaled median row gradient, smallest to largest d_k",
                              drops["none"], high=-threshold("FLAT"))
            scaled = Effect("the same with the divisor", drops["sqrt"], -threshold("FLAT"), threshold("FLAT"))
            cell = modes["none"][0]
            flat_zero = [m for m in ("none", "sqrt") if not drops[m] and any(zeros[m].values())]
            places.append(Place(where(cell, phase=phase, d_k=spans["none"]), unscaled, [scaled],
                                unmeasurable=f"row gradient exactly 0 at both ends ({', '.join(flat_zero)})"
                                if flat_zero else ""))
    voting = [p for p in places if p.votes]
    head = next((p for p in voting if p.where.get("phase") == "init" and "init" not in p.where),
                voting[0] if voting else (places[0] if places else None))
    return Statement("C9", "large d_k pushes softmax into small gradients; the divisor counteracts", places, head,
                     "factor 10 from the smallest to the largest d_k (the span is the place's d_k)")


def statements(c: Cells) -> list[Statement]:
    return [c9_flat(c)]
