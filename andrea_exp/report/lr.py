"""Learning-rate sensitivity per cell (Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities"): E over the LR range of [min(l(eta), l_0) - l*].

Only experiments that sweep train.lr count; their cells are grouped by every other axis; each seed
gives one sensitivity, and the report shows their mean and spread. Settings are compared over one LR set,
the LRs every setting ran (a mean over 4 LRs is not comparable with one over 6). A setting no LR of which
trains (on the verdicts' scale, effects.trains) is marked and not ranked: its small spread says it fails
everywhere, not that it is robust. A diverged run counts at l_0; a failed one is not in any cell
(andrea_exp.report.run_status).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from andrea_exp.report import figures
from andrea_exp.report.cells import LR, LR_SWEEP, Cell, short
from andrea_exp.report.claims.common import final_loss
from andrea_exp.report.effects import References, references, trains, trains_rule
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
    sensitivity: Stat  # over `over`, the LR set shared by every setting compared
    initial: Stat
    diverged: int
    over: list[float] = None
    trains_at: list[float] = None  # the LRs that train it (None: not judged)


def lr_curves(cells: list[Cell], refs: dict[str, References] | None = None) -> list[LRCurve]:
    """One curve per setting; its sensitivity over the LRs every setting ran (each its own where they share
    fewer than 2); with `refs` (experiment -> references), the LRs that train it."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        if cell.kind != LR_SWEEP:
            continue  # an experiment at one LR says nothing about LR sensitivity
        axes = " ".join(f"{short(k)}={v}" for k, v in cell.axes.items() if k != LR)
        ctx = " ".join(t for t in (f"[{cell.experiment}]" if cell.experiment else "", axes) if t) or "all"
        groups.setdefault(ctx, []).append(cell)
    ran = [{float(run.config[LR]) for cell in group for run in cell.runs if run.config.get(LR) is not None}
           for group in groups.values()]
    ran = [lrs for lrs in ran if len(lrs) >= 2]
    shared = sorted(set.intersection(*ran)) if ran else []
    curves = []
    for ctx, group in groups.items():
        runs = [run for cell in group for run in cell.runs]
        lrs = sorted({float(run.config[LR]) for run in runs if run.config.get(LR) is not None})
        if len(lrs) < 2:
            continue
        over = shared if len(shared) >= 2 else lrs
        initial = stat(run.initial_loss() for run in runs)
        l0 = initial.mean
        per_seed: dict = {}
        for run in runs:
            loss = final_loss(run)
            per_seed.setdefault(run.seed, {})[float(run.config[LR])] = loss
        loss_by_lr = {lr: stat(min(v[lr], l0) if v.get(lr) is not None and math.isfinite(v[lr]) else l0
                                for v in per_seed.values() if lr in v) for lr in lrs}
        shared_runs = [{lr: loss for lr, loss in v.items() if lr in over} for v in per_seed.values()]
        sens = stat(lr_sensitivity(v, l0) for v in shared_runs if len(v) >= 2)
        diverged = sum(not finished(run) for run in runs)  # cells hold no failed runs
        good = None
        if refs is not None:
            ref = refs.get(group[0].experiment) or references(group)
            good = [float(c.get(LR)) for c in sorted(group, key=lambda c: float(c.get(LR))) if trains(c.runs, ref)]
        curves.append(LRCurve(ctx, lrs, loss_by_lr, sens, initial, diverged, over, good))
    return sorted(curves, key=lambda c: sort_key(c.context))


def sensitivity_text(c: LRCurve) -> str:
    if c.trains_at == []:
        return f"never trains: not ranked ({c.sensitivity})"
    return str(c.sensitivity)


def lr_section(cells: list[Cell], fig_path: Path, refs: dict[str, References] | None = None) -> str:
    """Markdown for the LR-sensitivity section, with its figures (written beside fig_path)."""
    curves = lr_curves(cells, refs if refs is not None else {})
    intro = ("## Beyond the chapter: learning-rate sensitivity\n\n"
             "LR sensitivity (Wortsman et al. 2023) = mean over the swept LRs of [min(l(eta), l_0) - l*], with l(eta) "
             "the final held-out loss at learning rate eta, l* the best of them, l_0 the step-0 training loss; "
             "diverged runs count as l_0. Lower means the cell trains well over a wider LR range.\n\n")
    if not curves:
        return intro + ("**not measured**: no cell ran at two or more learning rates; run "
                        "`andrea-exp -m experiment=lr_sensitivity` and pass its sweep directory.\n")
    rows = [[c.context, ", ".join(f"{lr:g}" for lr in c.lrs), str(c.initial),
             " / ".join(f"{c.loss_by_lr[lr].mean:.3f}" for lr in c.lrs), c.diverged,
             ", ".join(f"{lr:g}" for lr in c.trains_at) or "none", sensitivity_text(c)] for c in curves]
    over = sorted({", ".join(f"{lr:g}" for lr in c.over) for c in curves})
    rule = trains_rule(next(iter(refs.values()))) if refs else "progress >= 0.5"
    table = (f"Compared over lr {' | '.join(over)} (the LRs every setting ran). An LR trains a setting when >= 2/3 "
             f"of its seeds finish with {rule}, as in the verdicts.\n\n" +
             md_table(["cell", "LRs", "l_0", "final loss per LR", "runs not finished", "LRs that train",
                       "LR sensitivity (over the shared LRs)"], rows))
    loss_series = {c.context: [(lr, c.loss_by_lr[lr].mean, c.loss_by_lr[lr].std) for lr in c.lrs] for c in curves}
    path = figures.line_panels(fig_path, [
        {"title": "final loss against the learning rate (diverged = l_0)", "xlabel": "learning rate",
         "ylabel": "final held-out loss", "series": loss_series, "logx": 10}], n_cols=1)
    bars = figures.grouped_bars(fig_path.with_name(fig_path.stem + "_per_cell.png"), [c.context for c in curves],
                                {"LR sensitivity": [(c.sensitivity.mean, c.sensitivity.std) for c in curves]},
                                ylabel="sensitivity (nats)", title="LR sensitivity per cell (lower: wider good range)")
    return intro + table + f"\n\n![LR sensitivity](figures/{path.name}) ![per cell](figures/{bars.name})\n"
