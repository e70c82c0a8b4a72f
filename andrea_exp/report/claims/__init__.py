"""The claims C1-C9 (experiments/CLAIMS.md), one module each: the one registry of claims.

Each module owns its statements and their decisions, `statements(cells) -> list[Statement]` (effect sizes,
andrea_exp.report.verdicts), and the evidence shown under them in the appendix, `claim(study) -> ClaimResult`
(tables, figures, per-check detail; it decides nothing). The first screen, the appendix and the chapter-scale
page all iterate CLAIMS below, in this order. Adding a claim: a new module with both, and its line here.
"""

from __future__ import annotations

from andrea_exp.report.claims import c1, c2, c3, c4, c5, c6, c7, c8, c9
from andrea_exp.report.claims.common import ClaimResult
from andrea_exp.report.study import Study
from andrea_exp.report.verdicts import Cells, Statement

CLAIMS = (c1, c2, c3, c4, c5, c6, c7, c8, c9)


def all_statements(cells: Cells, source: str | None = None) -> list[Statement]:
    """Every claim's statements in claim order; `source` keeps one kind ("runs" or "built-in")."""
    found = [s for claim in CLAIMS for s in claim.statements(cells)]
    return [s for s in found if source is None or s.source == source]


def all_evidence(study: Study) -> list[ClaimResult]:
    return [claim.claim(study) for claim in CLAIMS]
