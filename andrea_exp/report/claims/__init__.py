"""The claims C1-C9 (experiments/CLAIMS.md), one module each, each with `claim(study) -> ClaimResult`.

A claim gathers its numbers from the study, turns them into Checks with its thresholds applied and
leaves the verdict to andrea_exp.report.rules. Adding a claim: a new module with `claim(study)`, and
its line in CLAIMS below (the report's sections follow this order).
"""

from __future__ import annotations

from andrea_exp.report.claims import c1, c2, c3, c4, c5, c6, c7, c8, c9
from andrea_exp.report.claims.common import ClaimResult
from andrea_exp.report.study import Study

CLAIMS = (
    c1.claim,
    c2.claim,
    c3.claim,
    c4.claim,
    c5.claim,
    c6.claim,
    c7.claim,
    c8.claim,
    c9.claim,
)


def all_claims(study: Study) -> list[ClaimResult]:
    return [claim(study) for claim in CLAIMS]
