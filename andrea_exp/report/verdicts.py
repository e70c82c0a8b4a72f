"""One verdict per statement of the chapter, decided on effect sizes (andrea_exp.report.effects); each claim
module (andrea_exp.report.claims.cN) builds its statements' places, this module turns places into a verdict.

Every place votes, except one that cannot measure the claim (a row gradient of exactly 0 on both sides of a
ratio, a twin that did not train, no reference for progress, runs that failed (out of memory, killed, an error:
not a result) on its side or its twin's: named "not measured" with the reason) and a step-0
value the initialisation itself sets ("by construction at init": shown, not evidence). LR and phase of
training (init = step 0, early = steps 1..200, end = the last probe) are axes of the condition. The verdict:

- every place measured holds                      -> holds
- no place holds and none is inconclusive         -> does not hold
- no place holds, some inconclusive               -> inconclusive
- otherwise                                       -> holds where: "at k of n places", the places that hold
                                                     (the axis with most values merged, d_k on a tie), then
                                                     those where it does not and the inconclusive ones
- no place measured, only places by construction  -> by construction at init (what they show in brackets)

A place whose effect cannot be read as the claim asks (a seed that memorised its training data, a leak still
growing when the run ended) is set aside, out of the vote, and named by why (andrea_exp.report.set_aside).

Every cell that trains votes at its own LR, an LR sweep's too, so more runs only add places.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from andrea_exp.report.cells import INIT_ONLY, LR, LR_SWEEP, TRAINING, Cell, short
from andrea_exp.report.effects import (
    BY_CONSTRUCTION,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_MEASURED,
    Effect,
    Place,
    References,
    fmt,
    references,
)
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import distinct_cells
from andrea_exp.report.set_aside import SetAside
from andrea_exp.report.stats import sort_key

CONDITIONAL = "holds where"


@dataclass
class Statement:
    id: str  # C4a
    text: str
    places: list[Place]
    headline: Place | None  # the place whose effect the first screen shows
    reference: str  # what the effect is measured against
    source: str = "runs"  # runs | built-in (exact checks of the pipeline, no training)
    notes: list[str] = field(default_factory=list)  # printed under the first screen's table
    short: bool = False  # some runs behind it are too short to judge training (seeds.is_short): its row says so

    @property
    def verdict(self) -> tuple[str, str]:
        voting = [p for p in self.places if not p.by_construction]
        built = [p for p in self.places if p.by_construction]
        if built and not [p for p in voting if p.decision != NOT_MEASURED]:
            verdict, condition = summarise(built, construction=True)
            return BY_CONSTRUCTION, f"{verdict} {condition}" + unmeasured_text(voting)
        aside = verdict_with_aside(voting)  # the places set aside named after the others' verdict
        if aside is not None:
            verdict, condition = aside
        else:
            verdict, condition = summarise(voting)
            main = [p for p in voting if "init" not in p.where]
            other = [p for p in voting if "init" in p.where]
            if main and other:  # the default init named in full; the other inits counted, every place in the appendix
                condition = summarise(main)[1] + "; other inits: " + ", ".join(
                    f"{init} holds at {sum(p.decision == HOLDS for p in ps)} of "
                    f"{sum(p.decision != NOT_MEASURED for p in ps)} places"
                    for init, ps in group_by(other, "init").items())
        if built:
            condition += f"; step 0 {BY_CONSTRUCTION}, not counted: {len(built)} places"
        return verdict, condition


def unmeasured_text(places: list[Place]) -> str:
    """'; not measured at d_k 64 (neither twin trained)': the places that cannot vote, with their reasons."""
    reasons: dict[str, list[Place]] = {}
    for p in places:
        if p.why:
            reasons.setdefault(p.why, []).append(p)
    return "".join(f"; not measured at {compact(ps)} ({why})" for why, ps in reasons.items())


def summarise(places: list[Place], construction: bool = False) -> tuple[str, str]:
    """The verdict over places by the rule in this module's docstring, and its condition (which never repeats
    the verdict's words)."""
    measured = [p for p in places if p.decision != NOT_MEASURED]
    decide = (lambda p: p.measured_decision) if construction else (lambda p: p.decision)
    if not measured:
        reasons = sorted({p.why for p in places if p.why})
        return NOT_MEASURED, "; ".join(reasons) or "no runs measure it"
    by = {d: [p for p in measured if decide(p) == d] for d in (HOLDS, FAILS, INCONCLUSIVE)}
    rest = unmeasured_text(places)
    if len(by[HOLDS]) == len(measured):
        return HOLDS, f"at every place measured ({compact(measured)})" + rest
    if not by[HOLDS]:
        if not by[INCONCLUSIVE]:
            return FAILS, f"at every place measured ({compact(by[FAILS])})" + rest
        parts = [f"at {compact(by[INCONCLUSIVE])}", f"does not hold at {compact(by[FAILS])}" if by[FAILS] else ""]
        return INCONCLUSIVE, "; ".join(p for p in parts if p) + rest
    parts = [f"at {len(by[HOLDS])} of {len(measured)} places: {compact(by[HOLDS])}",
             f"does not hold at {compact(by[FAILS])}" if by[FAILS] else "",
             f"inconclusive at {compact(by[INCONCLUSIVE])}" if by[INCONCLUSIVE] else ""]
    return CONDITIONAL, "; ".join(p for p in parts if p) + rest


def compact(places: list[Place]) -> str:
    """Places with one axis merged, the one with most values (d_k on a tie): 'd_k 256, 4096 (phase init)'."""
    keys = [k for k in places[0].where if all(k in p.where for p in places)] if places else []
    if not keys:
        return "; ".join(p.label() for p in places)
    merge = max(keys, key=lambda k: (len({str(p.where[k]) for p in places}), k == "d_k"))
    groups: dict[str, list] = {}
    for p in places:
        rest = " ".join(f"{k} {fmt(v)}" for k, v in p.where.items() if k != merge)
        groups.setdefault(rest, []).append(p.where[merge])
    parts = []
    for rest, values in groups.items():
        # the text breaks ties ("0.0005" and "best 0.0005"): a set's order changes with the process's string hashes
        values = sorted(set(map(fmt, values)), key=lambda v: (PHASE_ORDER.get(v, -1), sort_key(_number(v)), v))
        head = f"{merge} {', '.join(values)}"
        parts.append(f"{head} ({rest})" if rest else head)
    return "; ".join(parts)


def group_by(places: list[Place], key: str) -> dict:
    out: dict = {}
    for p in places:
        out.setdefault(p.where[key], []).append(p)
    return out


PHASE_ORDER = {"init": 0, "early": 1, "end": 2}  # phases of training in time order, not by name


def _number(text: str):
    try:
        return float(text.replace("best ", "").replace(" (grid)", ""))
    except ValueError:
        return text


# ---------------------------------------------------------------- what the statements read


@dataclass
class Cells:
    training: list[Cell]  # every cell that trains, each distinct run once: an LR sweep's at each of its LRs too
    init_only: list[Cell]
    lr_sweep: list[Cell]
    refs: dict[str, References]  # experiment label -> its references

    @classmethod
    def of(cls, cells: list[Cell], reference_runs: list[Run] = ()) -> Cells:
        """The judged cells by kind, and each experiment's references (reference runs: report_role reference,
        already split off the judged runs by andrea_exp.report.reference.split)."""
        distinct = distinct_cells(cells)
        refs = {}
        for label in {c.experiment for c in distinct}:
            refs[label] = references([c for c in distinct if c.experiment == label], reference_runs)
        trains = [c for c in distinct if c.kind in (TRAINING, LR_SWEEP)]
        return cls(trains, [c for c in distinct if c.kind == INIT_ONLY], [c for c in distinct if c.kind == LR_SWEEP],
                   refs)

    def ref(self, cell: Cell) -> References:
        return self.refs[cell.experiment]


def exact_places(checks) -> list[Place]:
    """A built-in statement's exact checks as places: each decided on its own (n=1) signed distance from its
    threshold (> 0 on the claim's side), +-1 where the check has no distance (an equality)."""
    places = []
    for c in checks:
        distance = c.distance if c.distance is not None else (1.0 if c.ok else -1.0)
        name = " ".join(t for t in (c.value, c.threshold and f"(needs {c.threshold})") if t) or "exact check"
        places.append(Place(dict(c.where), Effect(name, {"exact": distance}, low=0.0)))
    return places


def is_causal(cell: Cell) -> bool:
    return str(cell.get("model.causal")).lower() == "true"


NAMED_AXES = ("model.d_k", "model.qk_init", "model.scale", "model.causal")  # named above, or paired on by claims


def where(cell: Cell, **extra) -> dict:
    out = {"d_k": cell.get("model.d_k")}
    if cell.get("model.qk_init") not in (None, "unit"):
        out["init"] = cell.get("model.qk_init")
    # the cell's other axes (lr, ...): two values of one are two places; a switch left off is every place's baseline
    for axis, value in cell.axes.items():
        if axis not in NAMED_AXES and value is not False and value is not None:
            out[short(axis)] = lr_text(cell) if axis == LR else value
    return {**out, **extra}


def no_reference(refs: References) -> str:
    """Why progress cannot be read on this experiment's data ("" when it can)."""
    if refs.top is not None:
        return ""
    return "no reference run: the data has no known floor and no report_role=reference run was trained on it"


def phases_of(cell: Cell) -> tuple[str, ...]:
    return ("init",) if cell.kind == INIT_ONLY else ("init", "early", "end")


def lr_text(cell: Cell) -> str:
    return f"{float(cell.get(LR)):.2g}"


# ---------------------------------------------------------------- helpers


def dedupe(places: list[Place]) -> list[Place]:
    """One place per condition (two experiments may measure the same one): the one with more seeds."""
    kept: dict[str, Place] = {}
    for p in places:
        key = repr(sorted((k, str(v)) for k, v in p.where.items()))
        if key not in kept or p.effect.stat.n > kept[key].effect.stat.n:
            kept[key] = p
    return sorted(kept.values(), key=lambda p: [sort_key(v) for v in p.where.values()])


def max_dk(places: list[Place]):
    dks = [p.where.get("d_k") for p in places if isinstance(p.where.get("d_k"), (int, float))]
    return max(dks) if dks else None


def pick(places: list[Place], **want) -> Place | None:
    """The place at the largest d_k matching `want` (the chapter's strongest case), the default init first and a
    place at one fixed LR (a grid's) before an LR sweep's, else the last one."""
    top = max_dk(places)
    for p in sorted(reversed(places), key=lambda p: ("init" in p.where, "lr" in p.where)):
        if all(str(p.where.get(k)) == str(v) for k, v in want.items()) and p.where.get("d_k") in (top, None):
            return p
    return places[-1] if places else None


def verdict_with_aside(places: list[Place]) -> tuple[str, str] | None:
    """(verdict, condition) of the places with the set-aside ones named; None when none is set aside (the
    statement's own verdict stands)."""
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
