"""Learning-rate sensitivity per cell (Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities"): E over the LR range of [min(l(eta), l_0) - l*].

Only experiments that sweep train.lr count; their cells are grouped by every other axis; each seed
gives one sensitivity over the LRs it ran, and the report shows their mean and spread. A diverged run
counts at l_0; a failed one is not in any cell (andrea_exp.report.run_status).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from andrea_exp.report import figures
from andrea_exp.report.cells import LR, LR_SWEEP, Cell, short
from andrea_exp.report.claims.common import final_loss
from andrea_exp.report.run_status import finished
from andrea_exp.report.stats import Stat, sort_key, stat
from andrea_exp.report.table import md_table


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


@dataclass
class LRCurve:
    context: str
    lrs: list[float]
    loss_by_lr: dict  # lr -> Stat of the final loss (diverged runs at l_0)
    sensitivity: Stat
    initial: Stat
    diverged: int


def lr_curves(cells: list[Cell]) -> list[LRCurve]:
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        if cell.kind != LR_SWEEP:
            continue  # an experiment at one LR says nothing about LR sensitivity
        axes = " ".join(f"{short(k)}={v}" for k, v in cell.axes.items() if k != LR)
        ctx = " ".join(t for t in (f"[{cell.experiment}]" if cell.experiment else "", axes) if t) or "all"
        groups.setdefault(ctx, []).append(cell)
    curves = []
    for ctx, group in groups.items():
        runs = [run for cell in group for run in cell.runs]
        lrs = sorted({float(run.config[LR]) for run in runs if run.config.get(LR) is not None})
        if len(lrs) < 2:
            continue
        initial = stat(run.initial_loss() for run in runs)
        l0 = initial.mean
        per_seed: dict = {}
        for run in runs:
            loss = final_loss(run)
            per_seed.setdefault(run.seed, {})[float(run.config[LR])] = loss
        loss_by_lr = {lr: stat(min(v[lr], l0) if v.get(lr) is not None and math.isfinite(v[lr]) else l0
                                for v in per_seed.values() if lr in v) for lr in lrs}
        sens = stat(lr_sensitivity(v, l0) for v in per_seed.values() if len(v) >= 2)
        diverged = sum(not finished(run) for run in runs)  # cells hold no failed runs
        curves.append(LRCurve(ctx, lrs, loss_by_lr, sens, initial, diverged))
    return sorted(curves, key=lambda c: sort_key(c.context))


def lr_section(cells: list[Cell], fig_path: Path) -> str:
    """Markdown for the LR-sensitivity section, with its figures (written beside fig_path)."""
    curves = lr_curves(cells)
    intro = ("## Beyond the chapter: learning-rate sensitivity\n\n"
             "LR sensitivity (Wortsman et al. 2023) = mean over the swept LRs of [min(l(eta), l_0) - l*], with l(eta) "
             "the final held-out loss at learning rate eta, l* the best of them, l_0 the step-0 training loss; "
             "diverged runs count as l_0. Lower means the cell trains well over a wider LR range.\n\n")
    if not curves:
        return intro + ("**not measured**: no cell ran at two or more learning rates; run "
                        "`andrea-exp -m experiment=lr_sensitivity` and pass its sweep directory.\n")
    rows = [[c.context, ", ".join(f"{lr:g}" for lr in c.lrs), str(c.initial),
             " / ".join(f"{c.loss_by_lr[lr].mean:.3f}" for lr in c.lrs), c.diverged, str(c.sensitivity)]
            for c in curves]
    table = md_table(["cell", "LRs", "l_0", "final loss per LR", "runs not finished", "LR sensitivity"], rows)
    loss_series = {c.context: [(lr, c.loss_by_lr[lr].mean, c.loss_by_lr[lr].std) for lr in c.lrs] for c in curves}
    path = figures.line_panels(fig_path, [
        {"title": "final loss against the learning rate (diverged = l_0)", "xlabel": "learning rate",
         "ylabel": "final held-out loss", "series": loss_series, "logx": 10}], n_cols=1)
    bars = figures.grouped_bars(fig_path.with_name(fig_path.stem + "_per_cell.png"), [c.context for c in curves],
                                {"LR sensitivity": [(c.sensitivity.mean, c.sensitivity.std) for c in curves]},
                                ylabel="sensitivity (nats)", title="LR sensitivity per cell (lower: wider good range)")
    return intro + table + f"\n\n![LR sensitivity](figures/{path.name}) ![per cell](figures/{bars.name})\n"
