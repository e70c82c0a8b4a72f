"""The rules that turn numbers into verdicts, and the LR-sensitivity measure. Pure functions, no I/O.

A claim is tested by a list of Checks: one yes/no test, with its threshold already applied, at one
place (`where`: d_k, scale, qk_init, when, part of the claim, ...). `verdict` turns the list into one
of VERDICTS by a fixed rule:

- no checks                                  -> not measured
- every check passes                         -> holds
- no check passes                            -> does not hold
- one axis of `where` separates pass from fail (each of its values always passes or always fails)
    axis "part" (the claim has several parts)  -> partly holds (names the parts that hold)
    any other axis                             -> holds only under a stated condition (its values;
                                                  "d_k >= 256" when the passing values are the large ones)
- otherwise                                  -> partly holds (k of n checks pass; where they pass)
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
    detail: str = ""  # the numbers behind it, e.g. "max prob 0.93 >= 0.5"


@dataclass
class Verdict:
    verdict: str
    condition: str  # where it holds, or what is missing; "" when there is nothing to add


def _numeric(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


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


def verdict(checks: list[Check], missing: str = "") -> Verdict:
    """One verdict from a claim's checks, by the rule in this module's docstring."""
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
    places = "; ".join(", ".join(f"{k}={v}" for k, v in c.where.items()) for c in passed[:6])
    more = f" (+{len(passed) - 6} more)" if len(passed) > 6 else ""
    return Verdict(PARTLY, f"{len(passed)} of {len(checks)} checks pass: {places}{more}")


def lr_sensitivity(final_losses: dict, initial_loss: float) -> float:
    """Wortsman et al. (2023): E over the LR range of [min(l(eta), l_0) - l*].

    final_losses: lr -> final loss, None or non-finite for a diverged run (counted as l_0).
    l* is the best final loss over the range (itself capped at l_0).
    """
    if not final_losses:
        raise ValueError("lr_sensitivity needs at least one learning rate")
    capped = []
    for loss in final_losses.values():
        ok = loss is not None and math.isfinite(loss)
        capped.append(min(loss, initial_loss) if ok else initial_loss)
    best = min(capped)
    return sum(loss - best for loss in capped) / len(capped)


def progress(initial: float, final: float | None, target: float) -> float:
    """Share of the learnable gap closed: (l_0 - l) / (l_0 - target); 0 for a diverged run."""
    if final is None or not math.isfinite(final) or initial - target <= 0:
        return 0.0
    return (initial - final) / (initial - target)
