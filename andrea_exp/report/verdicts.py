"""One verdict per statement of the chapter, decided on effect sizes (andrea_exp.report.effects).

Every place votes: no place is dropped because its premise failed or its runs did not train; a place where
the claim fails is named as such. LR and phase of training (init = step 0, early = steps 1..200, end = the
last probe) are axes of the condition. The verdict of a statement:

- every place measured holds                      -> holds
- no place holds and none is inconclusive         -> does not hold
- no place holds, some inconclusive               -> inconclusive
- otherwise                                       -> holds where: the places that hold are named (the axis
                                                     with most values merged, d_k on a tie), then those where
                                                     it does not and the inconclusive ones
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from andrea_exp.report.cells import INIT_ONLY, LR, LR_SWEEP, TRAINING, Cell
from andrea_exp.report.effects import (
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_MEASURED,
    PHASES,
    Effect,
    Place,
    References,
    best_lr_cells,
    fmt,
    groups,
    log10_ratio,
    loss_or_l0,
    paired_values,
    progress_of,
    references,
    threshold,
    twins,
)
from andrea_exp.report.seeds import distinct_cells, is_short, per_seed
from andrea_exp.report.stats import sort_key
from andrea_exp.runs import metric_keys as mk

CONDITIONAL = "holds where"


@dataclass
class Statement:
    id: str  # C4a
    text: str
    places: list[Place]
    headline: Place | None  # the place whose effect the first screen shows
    reference: str  # what the effect is measured against
    source: str = "runs"  # runs | built-in (synthetic checks of the pipeline, no training)
    notes: list[str] = field(default_factory=list)
    fixed_verdict: tuple[str, str] | None = None  # (verdict, condition) of a built-in check
    short: bool = False  # some runs behind it are too short to judge training (seeds.is_short): its row says so

    @property
    def verdict(self) -> tuple[str, str]:
        if self.fixed_verdict is not None:
            return self.fixed_verdict
        verdict, condition = summarise(self.places)
        main = [p for p in self.places if "init" not in p.where]
        other = [p for p in self.places if "init" in p.where]
        if main and other:  # the default init named in full; the other inits counted, every place in the appendix
            condition = summarise(main)[1] + "; other inits: " + ", ".join(
                f"{init} holds at {sum(p.decision == HOLDS for p in ps)} of {len(ps)} places"
                for init, ps in group_by(other, "init").items())
        return verdict, condition


def summarise(places: list[Place]) -> tuple[str, str]:
    measured = [p for p in places if p.decision != NOT_MEASURED]
    if not measured:
        return NOT_MEASURED, "no runs measure it"
    by = {d: [p for p in measured if p.decision == d] for d in (HOLDS, FAILS, INCONCLUSIVE)}
    if len(by[HOLDS]) == len(measured):
        return HOLDS, f"at every place measured ({compact(measured)})"
    if not by[HOLDS]:
        verdict = FAILS if not by[INCONCLUSIVE] else INCONCLUSIVE
        parts = [f"not at {compact(by[FAILS])}" if by[FAILS] else "",
                 f"inconclusive at {compact(by[INCONCLUSIVE])}" if by[INCONCLUSIVE] else ""]
        return verdict, "; ".join(p for p in parts if p)
    parts = [compact(by[HOLDS]), f"not at {compact(by[FAILS])}" if by[FAILS] else "",
             f"inconclusive at {compact(by[INCONCLUSIVE])}" if by[INCONCLUSIVE] else ""]
    return CONDITIONAL, "; ".join(p for p in parts if p)


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
        values = sorted(set(map(fmt, values)), key=lambda v: (PHASE_ORDER.get(v, -1), sort_key(_number(v))))
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
    training: list[Cell]  # training experiments' cells, each distinct run once
    init_only: list[Cell]
    lr_sweep: list[Cell]
    refs: dict[str, References]  # experiment label -> its references

    @classmethod
    def of(cls, cells: list[Cell]) -> Cells:
        distinct = distinct_cells(cells)
        refs = {}
        for label in {c.experiment for c in distinct}:
            refs[label] = references([c for c in distinct if c.experiment == label])
        return cls([c for c in distinct if c.kind == TRAINING], [c for c in distinct if c.kind == INIT_ONLY],
                   [c for c in distinct if c.kind == LR_SWEEP], refs)

    def ref(self, cell: Cell) -> References:
        return self.refs[cell.experiment]


def is_causal(cell: Cell) -> bool:
    return str(cell.get("model.causal")).lower() == "true"


def where(cell: Cell, **extra) -> dict:
    out = {"d_k": cell.get("model.d_k")}
    if cell.get("model.qk_init") not in (None, "unit"):
        out["init"] = cell.get("model.qk_init")
    return {**out, **extra}


def phases_of(cell: Cell) -> tuple[str, ...]:
    return ("init",) if cell.kind == INIT_ONLY else ("init", "early", "end")


def lr_text(cell: Cell) -> str:
    return f"{float(cell.get(LR)):.2g}"


# ---------------------------------------------------------------- the statements


def c2_growth(c: Cells) -> Statement:
    """The unscaled score std's log-log slope over d_k, smallest to largest d_k, per seed."""
    places = []
    cells = [x for x in c.training + c.init_only
             if x.get("model.scale") == "none" and (x.kind == INIT_ONLY or is_causal(x))]
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(f"{cell.experiment}|{cell.get('model.qk_init')}", []).append(cell)
    seen = set()
    for group in groups.values():
        group = sorted(group, key=lambda x: float(x.get("model.d_k")))
        lo, hi = group[0], group[-1]
        init = lo.get("model.qk_init")
        if len(group) < 2 or init in seen:
            continue
        seen.add(init)
        span = math.log(float(hi.get("model.d_k")) / float(lo.get("model.d_k")))
        key = mk.ATTN_SCORE_STD
        values = paired_values(hi, lo, PHASES["init"](key), PHASES["init"](key),
                               lambda a, b: math.log(a / b) / span if a > 0 and b > 0 else None)
        places.append(Place({"init": init, "d_k": f"{lo.get('model.d_k')}..{hi.get('model.d_k')}"},
                            Effect("slope of log std(q.k) over log d_k at step 0", values,
                                   0.5 - threshold("GROWTH"), 0.5 + threshold("GROWTH"))))
    head = next((p for p in places if p.where["init"] == "unit"), places[0] if places else None)
    return Statement("C2a", "q.k grows like sqrt(d_k) (the law)", places, head,
                     "slope 0.5 (std proportional to sqrt(d_k))")


def c3_peaked(c: Cells) -> tuple[Statement, str]:
    places = []
    for _, scaled, unscaled in twins([x for x in c.training + c.init_only if x.kind == INIT_ONLY or is_causal(x)],
                                     "model.scale", "sqrt", "none"):
        for phase in phases_of(unscaled):
            read = PHASES[phase](mk.ATTN_MAX_PROB)
            peak = Effect("unscaled mean max probability", per_seed(unscaled, read), low=threshold("PEAKED"))
            diff = Effect("unscaled - scaled max probability", paired_values(unscaled, scaled, read, read,
                                                                             lambda a, b: a - b), low=0.0)
            places.append(Place(where(unscaled, phase=phase), peak, [diff]))
    places = dedupe(places)
    head = pick(places, phase="init")
    return (Statement("C3", "without the divisor softmax becomes peaked", places, head,
                      f"max prob {threshold('PEAKED')} (and above the scaled twin)"), crossover(c))


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


def c4_vanish(c: Cells) -> Statement:
    places = []
    for _, scaled, unscaled in twins([x for x in c.training if is_causal(x)], "model.scale", "sqrt", "none"):
        for phase in ("init", "early"):
            read = PHASES[phase](mk.GRAD_SCORES_ROW_P50)
            ratio = Effect("log10(unscaled / scaled median row gradient)",
                           paired_values(unscaled, scaled, read, read, log10_ratio), high=threshold("VANISH"))
            places.append(Place(where(unscaled, phase=phase), ratio))
    places = dedupe(places)
    return Statement("C4a", "peaked softmax makes row gradients vanish", places,
                     pick(places, phase="early"), "scaled twin; log10 ratio -1 (10x smaller)")


def c4_stall(c: Cells) -> tuple[Statement, list[str]]:
    places, warnings = [], []
    for _, scaled, unscaled in twins([x for x in c.training if is_causal(x)], "model.scale", "sqrt", "none"):
        prog = progress_of(c.ref(unscaled))
        behind = Effect("scaled - unscaled progress", paired_values(scaled, unscaled, prog, prog, lambda a, b: a - b),
                        low=0.0)  # the stall is the divisor's doing only where the scaled twin got further
        places.append(Place(where(unscaled, lr=lr_text(unscaled)),
                            Effect("unscaled progress", per_seed(unscaled, prog), high=threshold("STALL")), [behind]))
    for cell, edge in best_lr_cells(c.lr_sweep):
        if cell.get("model.scale") != "none" or cell.get("model.qk_layernorm") is True:
            continue
        prog = progress_of(c.ref(cell))
        places.append(Place(where(cell, lr=f"best {lr_text(cell)}"),
                            Effect("unscaled progress at its best LR", per_seed(cell, prog), high=threshold("STALL"))))
        if edge:
            warnings.append(f"best LR of unscaled d_k {cell.get('model.d_k')} ({lr_text(cell)}) is at the edge of "
                            "the swept range")
    places = dedupe(places)
    head = next((p for p in reversed(places) if str(p.where.get("lr", "")).startswith("best")), pick(places))
    return Statement("C4b", "without the divisor training stalls", places, head,
                     "progress 0.25 (0 = bigram level, 1 = reference)"), warnings


def c5_unit_scale(c: Cells) -> Statement:
    places = []
    scaled = [x for x in c.training + c.init_only if x.get("model.scale") == "sqrt" and
              (x.kind == INIT_ONLY or is_causal(x))]
    for cell in scaled:
        places.append(Place(where(cell, phase="init"),
                            Effect("scaled score std", per_seed(cell, PHASES["init"](mk.ATTN_SCORE_STD)),
                                   1 / threshold("UNIT"), threshold("UNIT"))))
    for group in groups([x for x in scaled if x.kind == TRAINING], "model.d_k"):
        group = sorted(group, key=lambda x: float(x.get("model.d_k")))
        for cell in group[1:]:
            for phase in ("early", "end"):
                read = PHASES[phase](mk.ATTN_SCORE_STD)
                ratio = paired_values(cell, group[0], read, read, lambda a, b: a / b if b > 0 else None)
                places.append(Place(where(cell, phase=phase, vs=f"d_k {group[0].get('model.d_k')}"),
                                    Effect("score std / the smallest d_k's", ratio, 1 / threshold("UNIT"),
                                           threshold("UNIT"))))
    places = dedupe(places)
    head = next((p for p in places if p.where.get("phase") == "end" and p.where.get("d_k") == max_dk(places)),
                pick(places))
    return Statement("C5a", "with the divisor scores stay near unit scale whatever d_k", places, head,
                     "factor 2 of 1 (init) or of the smallest d_k (over training)")


def c5_proceeds(c: Cells) -> Statement:
    places = []
    for cell in c.training + c.lr_sweep:
        if cell.get("model.scale") != "sqrt" or not is_causal(cell) or cell.get("model.qk_layernorm") is True:
            continue
        prog = progress_of(c.ref(cell))
        lr = lr_text(cell) + ("" if cell.kind == LR_SWEEP else " (grid)")
        places.append(Place(where(cell, lr=lr),
                            Effect("scaled progress", per_seed(cell, prog), low=threshold("PROCEED"))))
    places = dedupe(places)
    head = next((p for p in places if "grid" in str(p.where.get("lr")) and p.where.get("d_k") == max_dk(places)),
                pick(places))
    return Statement("C5b", "with the divisor training proceeds at every d_k", places, head,
                     "progress 0.5 (0 = bigram level, 1 = reference)")


def c7_leak(c: Cells) -> Statement:
    places = []
    for _, causal, open_ in twins(c.training, "model.causal", True, False):
        ref = c.ref(open_)
        se = [r.last(mk.EVAL_LOSS_SE) for r in causal.runs + open_.runs]
        se = [v for v in se if v is not None and math.isfinite(v)]
        margin = max(threshold("LEAK"), 3 * math.sqrt(2) * (sum(se) / len(se))) if se else threshold("LEAK")
        # a run that did not finish counts at its step-0 loss (as in progress), never at a last value it logged
        last = lambda key: lambda run: run.last(key) if run.status == "finished" else None  # noqa: E731
        leak = Effect("twin loss - loss as trained", paired_values(causal, open_, loss_or_l0, loss_or_l0,
                                                                   lambda a, b: a - b), low=margin)
        also = []
        if ref.unigram is not None:
            also.append(Effect("generation loss - unigram level",
                               {s: v - ref.unigram for s, v in per_seed(open_, last(mk.EVAL_LOSS_GENERATION)).items()},
                               low=0.0))
        shown = []  # below the floor proves a leak, but a partial shortcut stays above it: shown, not required
        if ref.floor is not None:
            shown.append(Effect("floor - loss as trained", per_seed(open_, last(mk.EVAL_BELOW_FLOOR)), low=0.0))
        extra = {"scale": open_.get("model.scale")}
        if len({x.experiment for x in c.training}) > 1:
            extra["exp"] = open_.experiment
        places.append(Place(where(open_, **extra), leak, also, shown))
    places = dedupe(places)
    head = max((p for p in places), key=lambda p: (p.effect.stat.mean if p.effect.stat.n else -math.inf),
               default=None)
    short = any(is_short(r) for _, causal, open_ in twins(c.training, "model.causal", True, False)
                for r in causal.runs + open_.runs)
    return Statement("C7", "without the mask a shortcut is learned and fails at generation", places, head,
                     "causal twin (leak >= max(0.1, 3 SE)); generation above the unigram level", short=short)


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
            drops = {}
            for mode, cells in modes.items():
                cells = sorted(cells, key=lambda x: float(x.get("model.d_k")))
                if len(cells) > 1:
                    drops[mode] = paired_values(cells[-1], cells[0], read, read, log10_ratio)
            if len(drops) < 2:
                continue
            unscaled = Effect("log10 change of the unscaled median row gradient, smallest to largest d_k",
                              drops["none"], high=-threshold("FLAT"))
            scaled = Effect("the same with the divisor", drops["sqrt"], -threshold("FLAT"), threshold("FLAT"))
            cell = modes["none"][0]
            places.append(Place({k: v for k, v in where(cell, phase=phase).items() if k != "d_k"}, unscaled, [scaled]))
    return Statement("C9", "large d_k pushes softmax into small gradients; the divisor counteracts", places,
                     pick(places, phase="init"), "factor 10 from the smallest to the largest d_k")


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
    """The place at the largest d_k matching `want` (the chapter's strongest case), the default init first,
    else the last one."""
    top = max_dk(places)
    for p in sorted(reversed(places), key=lambda p: "init" in p.where):
        if all(str(p.where.get(k)) == str(v) for k, v in want.items()) and p.where.get("d_k") in (top, None):
            return p
    return places[-1] if places else None
