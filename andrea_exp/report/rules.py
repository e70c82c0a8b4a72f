"""A claim's per-check evidence rows, and training progress on the floor scale. Pure functions, no I/O.

A Check is one yes/no test, with its threshold already applied, at one place (`where`: d_k, scale, qk_init,
when, part of the claim, ...). Checks are evidence printed in the appendix under the statement they belong
to; they decide nothing: every verdict is a statement's (andrea_exp.report.verdicts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Check:
    where: dict  # e.g. {"part": "softmax peaked", "d_k": 64, "when": "init"}
    ok: bool
    value: str = ""  # the number tested, e.g. "0.93 ± 0.01 (n=3)"
    threshold: str = ""  # what it was tested against, e.g. ">= 0.5"
    distance: float | None = None  # signed distance from the threshold: > 0 on the passing side
    vote: bool = True  # False: shown in the claim's table as context for the others
    short: bool = False  # some of its runs are shorter than the report's minimum (a warning goes with it)
    thin: bool = False  # it rests on one seed of its place's several (the rest gave no value)


def progress(initial: float, final: float | None, target: float) -> float:
    """Share of the learnable gap closed: (l_0 - l) / (l_0 - target); 0 for a diverged run."""
    if final is None or not math.isfinite(final) or initial - target <= 0:
        return 0.0
    return (initial - final) / (initial - target)
