"""Section "Logit growth and its fixes": the `extras` experiment (d_k x divisor sqrt / inv (1/d_k) x
QK-LayerNorm off / on, over LRs). Per (d_k, fix): the largest LR that trains, the final loss per LR, the LR
sensitivity (lr.lr_sensitivity, per seed then mean), and curves over steps of the largest attention logit (the true
maximum over heads and layers where the runs logged it: report.largest), the spectral norm of scale * W_q W_k^T
(attn/qk_spectral) and the attention entropy, and whether the cell's attention collapsed (report.collapse).
experiments/README.md sets the papers' findings beside these numbers."""

from __future__ import annotations

from pathlib import Path

from andrea_exp.report import figures
from andrea_exp.report.bestlr import capped_final
from andrea_exp.report.cells import Cell
from andrea_exp.report.collapse import RULE as COLLAPSE_RULE
from andrea_exp.report.collapse import cell_collapsed
from andrea_exp.report.effects import References, references, trains_rule
from andrea_exp.report.effects import trains as trains_on_scale
from andrea_exp.report.fix_label import fix_label, lr_cells
from andrea_exp.report.largest import logit_key, logit_label
from andrea_exp.report.lr import lr_sensitivity
from andrea_exp.report.stats import stat
from andrea_exp.report.table import md_table
from andrea_exp.runs import metric_keys as mk

EXPERIMENT = "extras"
CURVE_KEYS = (mk.ATTN_SCORE_MAX, mk.ATTN_QK_SPECTRAL, mk.ATTN_ENTROPY)  # the first: logit_key of the runs
BASELINE = "scale=sqrt ln=False"


def trains(cell: Cell, refs: References) -> bool:
    """On the verdicts' progress scale (effects.trains): the same "trains" as C5b's "proceeds"."""
    return trains_on_scale(cell.runs, refs)


def grouped(cells: list[Cell]) -> dict[tuple, dict[float, Cell]]:
    """(d_k, fix) -> lr -> cell, for the extras experiment's cells (softcap, sigma-reparam and z-loss cells pooled
    with them keep rows of their own: fix_label)."""
    return lr_cells(cells, EXPERIMENT, lambda cell: (cell.get("model.d_k"), fix_label(cell)))


def sensitivity(by_lr: dict[float, Cell], lrs=None) -> tuple:
    """Stat over seeds of lr_sensitivity over the LRs each seed ran (l_0: that seed's step-0 loss);
    `lrs`: only these LRs (rows of one d_k compared over the LRs they all ran)."""
    per_seed: dict = {}
    l0: dict = {}
    for lr, cell in by_lr.items():
        if lrs is not None and lr not in lrs:
            continue
        for run in cell.runs:
            per_seed.setdefault(run.seed, {})[lr] = capped_final(run)
            if run.initial_loss() is not None:
                l0[run.seed] = run.initial_loss()
    return stat(lr_sensitivity(v, l0[s]) for s, v in per_seed.items() if len(v) >= 2 and s in l0)


def curve(cell: Cell, key: str, every_seed: bool = False) -> list[tuple]:
    """(step, mean, std) of a logged key over the cell's seeds, at the steps some seed logged a finite value,
    or with every_seed only where every seed did (a curve that does not jump when a seed stops early)."""
    per_step: dict[int, list[float]] = {}
    for run in cell.runs:
        for s, v in zip(*run.series(key)):
            per_step.setdefault(s, []).append(v)
    need = len(cell.runs) if every_seed else 1
    return [(s, st.mean, st.std) for s, v in sorted(per_step.items()) if (st := stat(v)).n >= need]


def shared_lrs(groups: dict, d_k) -> list[float]:
    """The LRs every (d_k, fix) row of this d_k ran: the set its LR sensitivities are compared over."""
    sets = [set(by_lr) for (d, _), by_lr in groups.items() if d == d_k]
    return sorted(set.intersection(*sets)) if sets else []


def growth_row(by_lr: dict[float, Cell], lr: float, keys=CURVE_KEYS) -> list[str]:
    """At one LR: the max logit at step 0, its largest mean over training and at the last probe; the spectral
    norm of the logit form at step 0 and last; the entropy at step 0 and last (means over seeds). keys: the
    logit's key first (logit_key), then CURVE_KEYS' others."""
    out = []
    for key in keys:
        points = curve(by_lr[lr], key) if lr in by_lr else []
        if not points:
            out += ["-"] * (3 if key == keys[0] else 2)
            continue
        first, last = points[0], points[-1]
        if key == keys[0]:
            top = max(points, key=lambda p: p[1])
            out += [f"{first[1]:.3g}", f"{top[1]:.3g} (step {top[0]})", f"{last[1]:.3g} (step {last[0]})"]
        else:
            out += [f"{first[1]:.3g}", f"{last[1]:.3g} (step {last[0]})"]
    return out


def curve_lr(groups: dict, d_k, refs: References) -> float | None:
    """The LR the curves are drawn at: the smallest at which the baseline fails to train, else the largest."""
    base = groups.get((d_k, BASELINE), {})
    failing = [lr for lr, cell in sorted(base.items()) if not trains(cell, refs)]
    lrs = sorted({lr for (d, _), by_lr in groups.items() if d == d_k for lr in by_lr})
    return failing[0] if failing else (lrs[-1] if lrs else None)


def growth_section(cells: list[Cell], fig_path: Path, refs: dict[str, References] | None = None) -> str:
    """`refs`: experiment label -> its references (the verdicts'); computed from the cells where not given."""
    groups = grouped(cells)
    label = next((c.experiment for by_lr in groups.values() for c in by_lr.values()), None)
    ref = (refs or {}).get(label) or references([c for by_lr in groups.values() for c in by_lr.values()])
    intro = ("## Logit growth and its fixes\n\n"
             "The `extras` experiment: the divisor 1/sqrt(d_k) against 1/d_k (muP), QK-LayerNorm off/on, per d_k, "
             f"over LRs. An LR trains a cell when >= 2/3 of its seeds finish with {trains_rule(ref)}, on the "
             "verdicts' scale (0 at the bigram level, 1 at the floor or reference run). "
             "LR sensitivity (Wortsman et al. 2023) = mean over the LRs of [min(l(eta), l_0) - l*], per seed "
             "(l_0 its step-0 loss, l* its best final loss, a run that diverged at l_0), then over seeds.\n\n")
    if not groups:
        return intro + f"**not measured**: no `{EXPERIMENT}` runs among the runs read; run `andrea-exp -m " \
                       f"experiment={EXPERIMENT} seed=0,1,2` and pass its sweep directory.\n"
    lrs = sorted({lr for by_lr in groups.values() for lr in by_lr})
    d_ks = sorted({d for d, _ in groups})
    shared = {d_k: shared_lrs(groups, d_k) for d_k in d_ks}  # per d_k, not per row: every row of it shares them
    curve_at = {d_k: curve_lr(groups, d_k, ref) for d_k in d_ks}
    logit = logit_key(run for by_lr in groups.values() for c in by_lr.values() for run in c.runs)
    keys = (logit, *CURVE_KEYS[1:])
    rows, growth_rows = [], []
    for (d_k, fix), by_lr in groups.items():
        good = [lr for lr, c in by_lr.items() if trains(c, ref)]
        losses = [f"{stat(map(capped_final, by_lr[lr].runs)).mean:.3f}" if lr in by_lr else "-" for lr in lrs]
        value = str(sensitivity(by_lr, shared[d_k]))
        if not good:  # l* itself near l_0: a small value says the cell fails everywhere, not that it is robust
            value = f"never trains: not ranked ({value})"
        rows.append([d_k, fix, f"{max(good):g}" if good else "none", *losses,
                     f"{value} over lr {', '.join(f'{lr:g}' for lr in shared[d_k])}"])
        at = by_lr.get(curve_at[d_k])
        collapsed = cell_collapsed(at.runs, ref) if at is not None else None
        growth_rows.append([d_k, fix, f"{curve_at[d_k]:g}", *growth_row(by_lr, curve_at[d_k], keys),
                            "not measured" if collapsed is None else "yes" if collapsed else "no"])
    table = md_table(["d_k", "fix", "largest LR that trains", *[f"loss at lr={lr:g}" for lr in lrs],
                      "LR sensitivity (over the LRs every row of the d_k ran)"], rows)
    growth_table = md_table(["d_k", "fix", "lr", "max logit, step 0", "max logit, largest", "max logit, last",
                             "qk_spectral, step 0", "qk_spectral, last", "entropy, step 0", "entropy, last",
                             "attention collapsed"], growth_rows)
    panels = []
    for d_k in d_ks:
        lr = curve_at[d_k]
        for key in keys:
            series = {fix: curve(by_lr[lr], key) for (d, fix), by_lr in groups.items() if d == d_k and lr in by_lr}
            panels.append({"title": f"d_k={d_k}, lr={lr:g}: {key}", "xlabel": "step", "ylabel": key,
                           "series": {k: v for k, v in series.items() if v},
                           "logy": key != mk.ATTN_ENTROPY})
    path = figures.line_panels(fig_path, panels, n_cols=len(keys))
    return intro + table + ("\n\nAttention logit growth (Dehghani et al. 2023; Wortsman et al. 2023) and entropy "
                            f"collapse (Zhai et al. 2023) over training: means over seeds of the {logit_label(logit)}, "
                            "`attn/qk_spectral` and `attn/entropy` at, per d_k, the smallest LR at which the baseline "
                            f"({BASELINE}) does not train, else the largest LR; {COLLAPSE_RULE} (>= 2/3 of the seeds "
                            "that can be read):\n\n" + growth_table +
                            f"\n\nThe same as curves: ![logit growth](figures/{path.name})\n")

