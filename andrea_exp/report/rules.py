"""The rules that turn checks into verdicts, and training progress. Pure functions, no I/O.

A claim is tested by a list of Checks (those marked vote=False are shown, not counted): one yes/no
test, with its threshold already applied, at one
place (`where`: d_k, scale, qk_init, when, part of the claim, ...). `verdict` turns the list into one
of VERDICTS by a fixed rule:

- no checks                                  -> not measured
- every check passes                         -> holds
- no check passes                            -> does not hold
- one axis of `where` separates pass from fail (each of its values always passes or always fails)
    axis "part" (the claim has several parts)  -> partly holds (names the parts that hold)
    any other axis                             -> holds only under a stated condition (its values;
                                                  "d_k >= 256" when the passing values are the large ones)
- otherwise                                  -> partly holds; with several parts, each part is described by
                                                the same rule; else k of n checks pass, and the places on
                                                the smaller side (where it holds, or where it does not) are
                                                named, d_k values of one place merged
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOLDS = "holds"
PARTLY = "partly holds"
CONDITIONAL = "holds only under a stated condition"
FAILS = "does not hold"
NOT_MEASURED = "not measured"
VERDICTS = (HOLDS, PARTLY, CONDITIONAL, FAILS, NOT_MEASURED)


@dataclass
class Check:
    where: dict  # e.g. {"part": "softmax peaked", "d_k": 64, "when": "init"}
    ok: bool
    value: str = ""  # the number tested, e.g. "0.93 ± 0.01 (n=3)"
    threshold: str = ""  # what it was tested against, e.g. ">= 0.5"
    distance: float | None = None  # signed distance from the threshold: > 0 on the passing side
    vote: bool = True  # False: shown in the claim's table, left out of its verdict
    short: bool = False  # some of its runs are shorter than the report's minimum (a warning goes with it)
    thin: bool = False  # its vote rests on one seed of its place's several (the rest gave no value)


@dataclass
class Verdict:
    verdict: str
    condition: str  # where it holds, or what is missing; "" when there is nothing to add


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _order(value):
    """Numbers in numeric order, then the rest as text."""
    return (0, value, "") if _numeric([value]) else (1, 0, str(value))


def _describe(axis: str, passing: set, failing: set) -> str:
    if _numeric(passing | failing):
        if min(passing) > max(failing):
            return f"{axis} >= {min(passing):g}"
        if max(passing) < min(failing):
            return f"{axis} <= {max(passing):g}"
    shown = " or ".join(f"'{v}'" for v in sorted(passing, key=str))
    return f"{axis} = {shown}"


def separating_axis(checks: list[Check]) -> tuple[str, set, set] | None:
    """The first axis (in `where` order) whose every value either always passes or always fails."""
    axes = [a for a in checks[0].where if all(a in c.where for c in checks)]
    for axis in axes:
        passing = {c.where[axis] for c in checks if c.ok}
        failing = {c.where[axis] for c in checks if not c.ok}
        if passing and failing and not passing & failing:
            return axis, passing, failing
    return None


MAX_PLACES = 4  # places named in a condition; the claim's section lists every check


def _value_text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def places(checks: list[Check]) -> str:
    """Where these checks are, one entry per place with its d_k values merged ("causal=True at d_k=64, 256")."""
    groups: dict[str, list] = {}
    for c in checks:
        # the experiment as "[name]"; "source=model" says nothing more once the experiment is named
        skip = ("d_k", "part", "experiment") + (("source",) if "experiment" in c.where else ())
        rest = " ".join(f"{k}={_value_text(v)}" for k, v in c.where.items() if k not in skip)
        if "experiment" in c.where:
            rest = f"[{c.where['experiment']}] {rest}".strip()
        groups.setdefault(rest, [])
        if "d_k" in c.where and c.where["d_k"] not in groups[rest]:
            groups[rest].append(c.where["d_k"])
    texts = []
    for rest, d_ks in groups.items():
        at = "d_k=" + ", ".join(map(str, sorted(d_ks, key=_order)))
        texts.append(f"{rest} at {at}" if rest and d_ks else rest or (at if d_ks else "everywhere"))
    more = f" (+{len(texts) - MAX_PLACES} more)" if len(texts) > MAX_PLACES else ""
    return "; ".join(texts[:MAX_PLACES]) + more


def _mixed(checks: list[Check]) -> str:
    """Condition text for checks some of which pass and none of whose axes separates them."""
    passed = [c for c in checks if c.ok]
    failed = [c for c in checks if not c.ok]
    side = f"holds at {places(passed)}" if len(passed) <= len(failed) else f"does not hold at {places(failed)}"
    return f"{len(passed)} of {len(checks)} checks pass; {side}"


def _describe_part(checks: list[Check]) -> str:
    if all(c.ok for c in checks):
        return HOLDS
    if not any(c.ok for c in checks):
        return FAILS
    split = separating_axis(checks)
    if split is not None:
        return f"holds only where {_describe(*split)}"
    return _mixed(checks)


def verdict(checks: list[Check], missing: str = "") -> Verdict:
    """One verdict from a claim's voting checks, by the rule in this module's docstring."""
    checks = [c for c in checks if c.vote]
    if not checks:
        return Verdict(NOT_MEASURED, missing)
    passed = [c for c in checks if c.ok]
    if len(passed) == len(checks):
        return Verdict(HOLDS, "")
    if not passed:
        return Verdict(FAILS, "")
    split = separating_axis(checks)
    if split is not None:
        axis, passing, failing = split
        if axis == "part":
            return Verdict(PARTLY, "holds: " + "; ".join(sorted(map(str, passing))) +
                           " | does not hold: " + "; ".join(sorted(map(str, failing))))
        return Verdict(CONDITIONAL, _describe(axis, passing, failing))
    parts = list(dict.fromkeys(c.where.get("part") for c in checks))
    if len(parts) > 1 and None not in parts:
        texts = []
        for part in parts:
            mine = [c for c in checks if c.where["part"] == part]
            texts.append(f"{part}: {_describe_part(mine)}")
        return Verdict(PARTLY, " | ".join(texts))
    return Verdict(PARTLY, _mixed(checks))


def progress(initial: float, final: float | None, target: float) -> float:
    """Share of the learnable gap closed: (l_0 - l) / (l_0 - target); 0 for a diverged run."""
    if final is None or not math.isfinite(final) or initial - target <= 0:
        return 0.0
    return (initial - final) / (initial - target)
