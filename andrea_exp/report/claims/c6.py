"""C6: the causal mask: exact checks of the masked softmax, and -inf against -1e9 over dtypes and score sizes."""

from __future__ import annotations

from andrea_exp.report import figures, static
from andrea_exp.report.claims.common import (
    ClaimResult,
)
from andrea_exp.report.rules import Check
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import Cells, Statement, exact_places

EXACT_ROW_SUM = 1e-6
AGREE_TOL = 1e-6  # -inf vs -1e9 probabilities
TITLE = "The causal mask (-inf or -1e9) leaves rows summing to 1 with mass only on [0, i]; row 0 is one-hot"


def agreement_condition(grid: list[dict]) -> tuple[bool, str]:
    """Whether -inf and -1e9 agree everywhere in the pipeline's grid, and where they stop agreeing, per dtype."""
    parts, everywhere = [], True
    for dtype in dict.fromkeys(r["dtype"] for r in grid):
        rows = sorted((r for r in grid if r["dtype"] == dtype), key=lambda r: r["magnitude"])
        agree = [not r["fill_error"] and r["nonfinite_rows_inf"] == 0 and r["nonfinite_rows_1e9"] == 0
                 and r["max_abs_diff"] <= AGREE_TOL for r in rows]
        everywhere &= all(agree)
        if all(agree):
            parts.append(f"{dtype}: agree at every magnitude tried (up to {rows[-1]['magnitude']:g})")
        elif rows[0]["fill_error"]:
            parts.append(f"{dtype}: -1e9 cannot be used ({rows[0]['fill_error']})")
        else:
            first_bad = next(r for r, ok in zip(rows, agree) if not ok)
            good = [r["magnitude"] for r, ok in zip(rows, agree) if ok and r["magnitude"] < first_bad["magnitude"]]
            parts.append(f"{dtype}: agree for score std up to {max(good):g}" if good else f"{dtype}: never agree")
    return everywhere, "; ".join(parts)


def exact_checks(exact: dict, pipeline: list[dict]) -> list[Check]:
    """The exact checks of the masked softmax, then one per dtype: -inf and -1e9 agree at every magnitude."""
    checks = [Check({"part": "rows sum to 1"}, exact["row_sum_max_dev"] <= EXACT_ROW_SUM,
                    value=f"max |row sum - 1| {exact['row_sum_max_dev']:.3g}", threshold=f"<= {EXACT_ROW_SUM:g}"),
              Check({"part": "no mass on j > i"}, exact["future_mass_max"] == 0.0,
                    value=f"{exact['future_mass_max']:g}", threshold="= 0"),
              Check({"part": "row 0 is [1, 0, 0, ...]"}, exact["row0_one_hot"],
                    value=f"one-hot: {exact['row0_one_hot']}", threshold="exactly"),
              Check({"part": "-inf and -1e9 agree in fp32 at unit-scale scores"},
                    exact["inf_vs_1e9_max_diff"] <= AGREE_TOL, value=f"{exact['inf_vs_1e9_max_diff']:.3g}",
                    threshold=f"<= {AGREE_TOL:g}")]
    for dtype in dict.fromkeys(r["dtype"] for r in pipeline):
        everywhere, condition = agreement_condition([r for r in pipeline if r["dtype"] == dtype])
        checks.append(Check({"part": "-inf and -1e9 agree at every score std tried", "dtype": dtype}, everywhere,
                            value=condition, threshold="agree"))
    return checks


def pipeline_grid() -> list[dict]:
    return [r for r in static.mask_fill_precision() if r["softmax"] == "fp32"]


def statements(c: Cells) -> list[Statement]:
    return [Statement("C6", TITLE, exact_places(exact_checks(static.pipeline_checks(), pipeline_grid())), None,
                      "exact check of the pipeline", "built-in")]


def claim(study: Study) -> ClaimResult:
    """The evidence: the exact checks and the -inf / -1e9 grid over dtypes and score sizes."""
    exact = static.pipeline_checks()
    grid = static.mask_fill_precision()
    pipeline = [r for r in grid if r["softmax"] == "fp32"]
    checks = exact_checks(exact, pipeline)
    table_rows = [[r["dtype"], f"{r['magnitude']:g}", r["softmax"], r["fill_error"] or "ok", r["max_abs_diff"],
                   r["future_mass_1e9"], r["nonfinite_rows_inf"], r["nonfinite_rows_1e9"]] for r in grid]
    panels = []
    for key, title in (("max_abs_diff", "max |P(-inf) - P(-1e9)|"), ("future_mass_1e9", "future mass with -1e9")):
        series = {f"{d} (softmax in fp32)": [(r["magnitude"], r[key], 0.0) for r in pipeline if r["dtype"] == d]
                  for d in dict.fromkeys(r["dtype"] for r in pipeline)}
        panels.append({"title": title + " (fp16: -1e9 not representable)", "xlabel": "score std",
                       "ylabel": key, "series": series, "logx": 10})
    path = figures.line_panels(study.fig("c6_mask_fill.png"), panels)
    exact_table = md_table(["check", "value"], [
        ["max |row sum - 1|", exact["row_sum_max_dev"]], ["max mass on j > i", exact["future_mass_max"]],
        ["row 0 exactly one-hot", exact["row0_one_hot"]],
        ["max |P(-inf) - P(-1e9)|, fp32", exact["inf_vs_1e9_max_diff"]]])
    grid_table = md_table(["scores dtype", "score std", "softmax in", "-1e9 fill", "max diff", "future mass (-1e9)",
                           "non-finite rows (-inf)", "non-finite rows (-1e9)"], table_rows)
    return ClaimResult(
        "C6", TITLE,
        "the explicit pipeline on random q, k, v (B=2, H=3, T=16, d_k=32, fp32) with -inf and -1e9; then random "
        "scores of std 1 to 1e10 stored in fp32, bf16 and fp16, masked with each fill, softmax in fp32 (the "
        "pipeline) and in the scores' own dtype (for comparison; benchmarks/mask_fill_precision.py has the full grid).",
        f"the exact checks pass when |row sum - 1| <= {EXACT_ROW_SUM:g}, future mass is exactly 0, row 0 is exactly "
        f"one-hot and the two fills agree within {AGREE_TOL:g}; if they pass but the fills disagree somewhere in the "
        "grid, the dtypes where they disagree somewhere are named.",
        checks, tables=[exact_table, grid_table], figures=[path])
