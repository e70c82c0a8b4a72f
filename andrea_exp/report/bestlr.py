"""The best learning rate of each cell of an LR sweep, the report's one rule for it: cells that differ only in
train.lr form a group; best = the lowest final held-out loss, mean over seeds, a run that diverged (or ended
above its start) counted at l_0 (its step-0 loss; run_status: failed runs never reach a cell); a cell with no
known loss is never the best. Ties go to the smaller LR. A group at one LR has no best LR; a best at the
smallest or largest LR swept is at the edge (the best may lie beyond it)."""

from __future__ import annotations

import math
from typing import NamedTuple

from andrea_exp.report.cells import LR, LR_SWEEP, Cell
from andrea_exp.report.run_status import finished
from andrea_exp.report.runs import Run
from andrea_exp.report.stats import stat
from andrea_exp.runs import metric_keys as mk


def final_loss(run: Run) -> float | None:
    """Final held-out loss as trained; None for a run that did not finish."""
    if not finished(run):
        return None
    return run.last(mk.EVAL_LOSS_AS_TRAINED)


def capped_final(run: Run) -> float | None:
    """min(final loss, l_0); l_0 for a run that did not finish; None when neither is known."""
    l0 = run.initial_loss()
    loss = final_loss(run)
    if loss is None or not math.isfinite(loss):
        return l0
    return min(loss, l0) if l0 is not None else loss


def lr_groups(cells: list[Cell]) -> list[list[Cell]]:
    """LR-sweep cells grouped by experiment and every axis but train.lr, the groups that ran two LRs or more."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        if cell.kind != LR_SWEEP or LR not in cell.axes:
            continue
        key = repr((cell.experiment, sorted((k, str(v)) for k, v in cell.axes.items() if k != LR)))
        groups.setdefault(key, []).append(cell)
    return [sorted(g, key=lambda c: float(c.get(LR))) for g in groups.values() if len(g) > 1]


def mean_final(cell: Cell) -> float:
    st = stat(capped_final(run) for run in cell.runs)
    return st.mean if st.n else math.inf


class BestLR(NamedTuple):
    cell: Cell
    at_edge: bool  # its LR is the smallest or the largest of the group's: the best may lie beyond the sweep


def best_lr(group: list[Cell]) -> BestLR | None:
    """The group's best cell (the module's rule); None when no cell of it has a known loss."""
    known = [(mean_final(c), float(c.get(LR)), c) for c in group]
    known = [k for k in known if math.isfinite(k[0])]
    if not known:
        return None
    _, lr, cell = min(known, key=lambda k: (k[0], k[1]))
    lrs = [k[1] for k in known]
    return BestLR(cell, len(lrs) > 1 and lr in (min(lrs), max(lrs)))


def best_lr_cells(cells: list[Cell]) -> list[BestLR]:
    """Each LR group's best (the groups of lr_groups: LR-sweep cells that ran two LRs or more)."""
    return [best for best in map(best_lr, lr_groups(cells)) if best is not None]
