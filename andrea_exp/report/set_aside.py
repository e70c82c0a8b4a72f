"""Places whose effect cannot be read as the claim asks, set aside from the vote and named in the verdict's
condition by why: "memorised (...)" (andrea_exp.report.memorisation) or "not reached within N steps"
(andrea_exp.report.leak_growth). Statement.verdict (andrea_exp.report.verdicts) applies this to every statement.

The verdict of the other places stands, with the set-aside places named after it; a statement whose measured
places are all set aside takes the verdict the places give for that case (`alone`: "not measured" for a
memorised place, the reason itself for a leak not reached within N steps).
"""

from __future__ import annotations

from andrea_exp.report.effects import HOLDS, NOT_MEASURED, Place


class SetAside(Place):
    """A place out of the vote; its decision is the reason, printed wherever places are."""

    def __init__(self, where: dict, effect, also=(), shown=(), *, reason: str, alone: str | None = None):
        super().__init__(where, effect, list(also), list(shown))
        self.reason = reason
        self.alone = alone  # the statement's verdict when only places set aside for this reason are measured

    @property
    def decision(self) -> str:
        return self.reason


def verdict_with_aside(places: list[Place]) -> tuple[str, str] | None:
    """(verdict, condition) of the places with the set-aside ones named; None when none is set aside (the
    statement's own verdict stands)."""
    # the verdict rules import this module
    from andrea_exp.report.verdicts import CONDITIONAL, compact, summarise, unmeasured_text

    aside = [p for p in places if isinstance(p, SetAside)]
    if not aside:
        return None
    rest = [p for p in places if not isinstance(p, SetAside)]
    reasons: dict[str, list[SetAside]] = {}
    for p in aside:
        reasons.setdefault(p.reason, []).append(p)
    named = "; ".join(f"{reason} at {compact(group)}" for reason, group in reasons.items())
    verdict, condition = summarise(rest)
    if verdict == NOT_MEASURED:  # no other place measured: the set-aside places say what there is to say
        alone = {p.alone or p.reason for p in aside}
        return (alone.pop() if len(alone) == 1 else NOT_MEASURED), named + unmeasured_text(rest)
    if verdict == HOLDS:
        return CONDITIONAL, f"{compact([p for p in rest if p.decision != NOT_MEASURED])}; {named}" + \
            unmeasured_text(rest)
    return verdict, f"{condition}; {named}"
