"""C1: one head computes a (T, T) score matrix; T = 1024 gives 1,048,576 scores (measured on the pipeline)."""

from __future__ import annotations

from andrea_exp.report import figures, static
from andrea_exp.report.claims.common import (
    ClaimResult,
)
from andrea_exp.report.rules import Check
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import Cells, Statement, exact_places


def exact_checks() -> list[Check]:
    main = static.score_matrix_count(1024, 64)
    return [Check({"part": "score matrix is (T, T)"}, main["shape"] == (main["T"], main["T"]),
                    value=f"shape {main['shape']}", threshold=f"({main['T']}, {main['T']})"),
              Check({"part": "T = 1024 gives 1,048,576 scores per head"}, main["count"] == 1_048_576,
                    value=f"{main['count']:,}", threshold="= 1,048,576")]


def statements(c: Cells) -> list[Statement]:
    return [Statement("C1", "One head computes a (T, T) score matrix; T = 1024 gives 1,048,576 scores",
                      exact_places(exact_checks()), None, "exact check of the pipeline", "built-in")]


def claim(study: Study) -> ClaimResult:
    """The evidence: the score count at T = 64..1024 (table and figure)."""
    by_T = [static.score_matrix_count(T, 64) for T in (64, 128, 256, 512, 1024)]
    checks = exact_checks()
    path = figures.line_panels(study.fig("c1_score_count.png"), [{
        "title": "scores per head per forward (explicit pipeline)", "xlabel": "T", "ylabel": "scores",
        "series": {"measured": [(r["T"], r["count"], 0.0) for r in by_T]},
        "refs": [("T^2", [r["T"] for r in by_T], [r["T"] ** 2 for r in by_T])], "logx": 2, "logy": True}], n_cols=1)
    seq_lens = sorted({run.config.get("data.seq_len") for run in study.claim_runs if run.config.get("data.seq_len")})
    notes = [f"Runs read used T = {', '.join(map(str, seq_lens))}: {', '.join(f'{t * t:,}' for t in seq_lens)} "
             "scores per head per sequence."] if seq_lens else []
    return ClaimResult(
        "C1", "One head computes a (T, T) score matrix; T = 1024 gives 1,048,576 scores",
        "andrea_exp.model.attention.explicit_attention on one head (B=1, H=1, d_k=64) at T = 64..1024; shape and "
        "element count of its `scores` stage.",
        "holds when the scores stage has shape (T, T) and T = 1024 gives exactly 1,048,576 entries.",
        checks,
        tables=[md_table(["T", "scores shape", "count"], [[r["T"], r["shape"], f"{r['count']:,}"] for r in by_T])],
        figures=[path], notes=notes)
