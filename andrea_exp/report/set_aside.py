"""Places whose effect cannot be read as the claim asks, set aside from the vote and named in the verdict's
condition by why: "memorised (...)" (andrea_exp.report.memorisation) or "not reached within N steps"
(andrea_exp.report.leak_growth).

The verdict of the other places stands, with the set-aside places named after it; a statement whose places
are all set aside takes the verdict its caller gives (the reason itself where it is one, e.g. "not reached
within 500 steps").
"""

from __future__ import annotations

from andrea_exp.report.effects import HOLDS, NOT_MEASURED, Place


class SetAside(Place):
    """A place out of the vote; its decision is the reason, printed wherever places are."""

    def __init__(self, where: dict, effect, also=(), shown=(), *, reason: str):
        super().__init__(where, effect, list(also), list(shown))
        self.reason = reason

    @property
    def decision(self) -> str:
        return self.reason


def verdict_with_aside(places: list[Place], alone: str | None = None) -> tuple[str, str] | None:
    """(verdict, condition) of the places with the set-aside ones named; None when none is set aside (the
    statement's own verdict stands). alone: the verdict when every measured place is set aside (None: the
    reason, when there is one)."""
    from andrea_exp.report.verdicts import CONDITIONAL, compact, summarise  # the verdict rules import this module

    aside = [p for p in places if isinstance(p, SetAside)]
    if not aside:
        return None
    rest = [p for p in places if not isinstance(p, SetAside)]
    reasons: dict[str, list[Place]] = {}
    for p in aside:
        reasons.setdefault(p.reason, []).append(p)
    named = "; ".join(f"{reason} at {compact(group)}" for reason, group in reasons.items())
    verdict, condition = summarise(rest)
    if verdict == NOT_MEASURED:
        one = next(iter(reasons)) if len(reasons) == 1 else NOT_MEASURED
        return (alone or one), named
    if verdict == HOLDS:
        return CONDITIONAL, f"{compact([p for p in rest if p.decision != NOT_MEASURED])}; {named}"
    return verdict, f"{condition}; {named}"
