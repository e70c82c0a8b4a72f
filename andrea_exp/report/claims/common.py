"""What every claim module shares: the result it returns, the thresholds two claims share, and the helpers
that read one number per run or per cell (mean over seeds) and pair scaled with unscaled cells."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from andrea_exp.report.bestlr import final_loss  # noqa: F401  (claims and lr.py read it from here)
from andrea_exp.report.cells import INIT_ONLY, Cell, short
from andrea_exp.report.rules import Check, progress
from andrea_exp.report.runs import Run
from andrea_exp.report.stats import Stat, sort_key, stat
from andrea_exp.runs import metric_keys as mk

# Thresholds more than one claim's evidence uses (each claim module holds its own; printed beside its table).
PEAKED_MAX_PROB = 0.5  # a row is dominated by one position when its max probability is >= 0.5 (mean over rows)


@dataclass
class ClaimResult:
    id: str
    title: str
    measured: str
    rule: str
    checks: list[Check]  # per-check detail: evidence shown under the statements' verdicts, deciding nothing
    tables: list[str] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    thresholds: dict = field(default_factory=dict)  # the module constants the evidence uses, printed beside it


def cell_stat(cell: Cell, fn) -> Stat:
    return stat([fn(run) for run in cell.runs])


def context_of(cell: Cell, drop: tuple[str, ...]) -> dict:
    """The cell's experiment, then its axes minus the ones a claim compares across, with short names; d_k
    always (right after the experiment)."""
    ctx = {"experiment": cell.experiment, "d_k": cell.get("model.d_k")}
    ctx.update({short(k): v for k, v in cell.axes.items() if k not in drop and k != "model.d_k"})
    return ctx


def context_label(ctx: dict, skip=("d_k",)) -> str:
    """"[claims_grid] causal=True qk_init=unit": the experiment in brackets, then the other axes."""
    axes = " ".join(f"{k}={v}" for k, v in ctx.items() if k not in skip and k != "experiment")
    exp = f"[{ctx['experiment']}]" if ctx.get("experiment") and "experiment" not in skip else ""
    return " ".join(t for t in (exp, axes) if t) or "all"


def scale_pairs(cells: list[Cell], drop: tuple[str, ...] = ()) -> list[tuple[dict, Cell, Cell]]:
    """(context, scaled cell, unscaled cell) for every context that has both 1/sqrt(d_k) and no divisor;
    `drop` names axes the twins may differ in (train.lr when each sits at its own best LR)."""
    groups: dict[str, dict] = {}
    for cell in cells:
        ctx = context_of(cell, ("model.scale", *drop))
        key = repr(sorted(ctx.items(), key=lambda kv: kv[0]))
        groups.setdefault(key, {"ctx": ctx})[cell.get("model.scale")] = cell
    pairs = [(g["ctx"], g["sqrt"], g["none"]) for g in groups.values() if "sqrt" in g and "none" in g]
    return sorted(pairs, key=lambda p: [sort_key(v) for v in p[0].values()])


def at_init(key: str):
    return lambda run: run.at_step(key, 0)


def at_end(key: str):
    return lambda run: run.probe_at_end(key)


def floor_of(run: Run) -> float | None:
    value = run.last(mk.EVAL_FLOOR)
    return value if value is not None and math.isfinite(value) else None


def trained(cell: Cell) -> bool:
    """Whether the cell's runs were meant to train (experiment=scaling_at_init takes no step)."""
    return cell.kind != INIT_ONLY and any((r.config.get("train.max_steps") or 0) > 0 for r in cell.runs)


def run_progress(run: Run) -> float:
    """Share of (l_0 - floor) closed by the end; floor 0 when unknown. 0 for runs that did not finish."""
    l0 = run.initial_loss()
    return 0.0 if l0 is None else progress(l0, final_loss(run), floor_of(run) or 0.0)


def missing_runs(what: str, experiment: str) -> str:
    return f"no {what} among the runs read; run `andrea-exp -m experiment={experiment}` and pass its sweep directory"
