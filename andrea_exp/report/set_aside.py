"""Places whose effect cannot be read as the claim asks, set aside from the vote and named in the verdict's
condition by why: "memorised (...)" (andrea_exp.report.memorisation) or "not reached within N steps"
(andrea_exp.report.leak_growth). Statement.verdict applies the rule that names them to every statement
(andrea_exp.report.verdicts.verdict_with_aside).

The verdict of the other places stands, with the set-aside places named after it; a statement whose measured
places are all set aside takes the verdict the places give for that case (`alone`: "not measured" for a
memorised place, the reason itself for a leak not reached within N steps).
"""

from __future__ import annotations

from andrea_exp.report.effects import Place


class SetAside(Place):
    """A place out of the vote; its decision is the reason, printed wherever places are."""

    def __init__(self, where: dict, effect, also=(), shown=(), *, reason: str, alone: str | None = None):
        super().__init__(where, effect, list(also), list(shown))
        self.reason = reason
        self.alone = alone  # the statement's verdict when only places set aside for this reason are measured

    @property
    def decision(self) -> str:
        return self.reason
