"""Seeds as replicates: per-seed values, the 2-of-3 vote, one run per distinct initialisation, the early
window of training, and which runs are too short to say much.

Vote: a place passes when at least SEED_PASS_SHARE of its seeds pass (rounded up: 2 of 3, 2 of 2, 1 of 1,
3 of 4). A run counts once per distinct initialisation: runs with the same scientific settings and seed
(e.g. the unit-init cells that claims_grid and qk_init both run) are one run.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from andrea_exp.report.cells import Cell, identity
from andrea_exp.report.rules import Check
from andrea_exp.report.runs import Run
from andrea_exp.report.stats import stat

SEED_PASS_SHARE = 2 / 3  # a place passes when >= 2/3 of its seeds pass
MIN_STEPS = 200  # runs planned shorter than this (and > 0) get a warning in the header and their verdicts
EARLY_WINDOW = (0, 200)  # steps (inclusive) of "early training": the mean over the probes in it


def seeds_needed(n: int) -> int:
    return math.ceil(SEED_PASS_SHARE * n - 1e-9)


def seed_vote(passes) -> bool:
    passes = list(passes)
    return bool(passes) and sum(map(bool, passes)) >= seeds_needed(len(passes))


def distinct_cells(cells: list[Cell]) -> list[Cell]:
    """The cells with each distinct run kept once (the first, a finished one preferred); empty cells dropped, but
    for those whose every run failed (kept, with no runs: a place that needs them is not measured, and says why)."""
    best: dict[str, Run] = {}
    for cell in cells:
        for run in cell.runs:
            key = identity(run)
            if key not in best or (best[key].status != "finished" and run.status == "finished"):
                best[key] = run
    kept, out = set(), []
    for cell in cells:
        runs = []
        for run in cell.runs:
            key = identity(run)
            if best[key] is run and key not in kept:
                kept.add(key)
                runs.append(run)
        if runs or cell.excluded:
            out.append(Cell(cell.axes, runs, cell.experiment, cell.kind, cell.excluded))
    return out


def is_short(run: Run) -> bool:
    steps = run.config.get("train.max_steps") or 0
    return 0 < steps < MIN_STEPS


def window_mean(key: str, window: tuple[int, int] = EARLY_WINDOW) -> Callable[[Run], float | None]:
    """Mean of a probe value over the probes with window[0] <= step <= window[1]; None when there are none."""
    def read(run: Run) -> float | None:
        values = [v for s, v in zip(*run.series(key)) if window[0] <= s <= window[1] and math.isfinite(v)]
        return sum(values) / len(values) if values else None
    return read


class SeedValues(dict):
    """seed -> value, and why there are none where the runs behind them failed (run_status)."""

    def __init__(self, values=(), why: str = ""):
        super().__init__(values)
        self.why = why


def per_seed(cell: Cell, fn) -> SeedValues:
    """seed -> fn(run), finite values only (runs of one seed averaged: there should be one after dedupe)."""
    values: dict = {}
    for run in cell.runs:
        v = fn(run)
        if v is not None and math.isfinite(v):
            values.setdefault(run.seed, []).append(v)
    failed = not cell.runs and cell.excluded
    return SeedValues({s: sum(v) / len(v) for s, v in values.items()}, "its runs failed" if failed else "")


def paired(a: Cell, b: Cell, fn_a, fn_b, combine) -> SeedValues:
    """seed -> combine(fn_a(a's run), fn_b(b's run)) for the seeds both cells ran (twins share the seed)."""
    va, vb = per_seed(a, fn_a), per_seed(b, fn_b)
    out = {}
    for s in va.keys() & vb.keys():
        v = combine(va[s], vb[s])
        if v is not None and math.isfinite(v):
            out[s] = v
    why = "its runs failed" if va.why and vb.why else ("its twin failed" if va.why or vb.why else "")
    return SeedValues(out, why)


def seed_check(where: dict, values: dict, passes, threshold: str, distance, runs=(), vote: bool = True
               ) -> Check | None:
    """One Check from per-seed values: passes(v) per seed, the place by the vote; None without values.
    distance(mean) is the signed distance of the seeds' mean from the threshold (> 0: passing side).
    runs: the place's runs (all its seeds, also those that gave no value), for the short and thin flags."""
    if not values:
        return None
    seeds = sorted(values, key=str)
    oks = [bool(passes(values[s])) for s in seeds]
    st = stat(values[s] for s in seeds)
    shown = ", ".join(f"{s}: {values[s]:.3g}" + ("" if ok else " x") for s, ok in zip(seeds, oks))
    text = f"{st}; seeds {shown}; {sum(oks)} of {len(oks)} pass"
    thin = len(oks) == 1 and len({r.seed for r in runs}) > 1  # e.g. one seed of three trained: 1 of 1 decides
    return Check(where, seed_vote(oks), text, f"{threshold} (>= {seeds_needed(len(oks))} of {len(oks)} seeds)",
                 distance=distance(st.mean), vote=vote, short=any(is_short(r) for r in runs), thin=thin)
