"""The figures of the first screen: at most 4 lines a panel, reference levels (floor, unigram, bigram) as dotted
lines, one legend below. Each function gathers its numbers from cells; figures.py draws (curve_panels)."""

from __future__ import annotations

import math
from pathlib import Path

from andrea_exp.report import figures
from andrea_exp.report.bestlr import best_lr_cells
from andrea_exp.report.cells import LR, Cell
from andrea_exp.report.effects import References, loss_or_l0, twins
from andrea_exp.report.growth import curve
from andrea_exp.report.largest import logit_key, logit_label
from andrea_exp.report.stats import stat
from andrea_exp.report.verdicts import Cells, is_causal
from andrea_exp.runs import metric_keys as mk


def ref_lines(refs: References) -> dict:
    out = {"floor": refs.floor, "bigram": refs.bigram, "unigram": refs.unigram}
    return {k: v for k, v in out.items() if v is not None and math.isfinite(v)}


def grid_cells(c: Cells) -> list[Cell]:
    """The training experiment that crosses d_k, the divisor and the mask (the claims grid), unit init."""
    by_exp: dict[tuple, list[Cell]] = {}
    for cell in c.training:  # at one LR: an experiment that also sweeps the LR holds a grid at each
        if {"model.d_k", "model.scale"} <= set(cell.axes) and cell.get("model.qk_init") in (None, "unit"):
            by_exp.setdefault((cell.experiment, str(cell.get(LR))), []).append(cell)
    return max(by_exp.values(), key=len, default=[])


def dks(cells: list[Cell]) -> list:
    return sorted({c.get("model.d_k") for c in cells}, key=float)


def pick_cell(cells: list[Cell], **want) -> Cell | None:
    for cell in cells:
        if all(str(cell.get(k)) == str(v) for k, v in want.items()):
            return cell
    return None


SCALE_LABEL = {"sqrt": "1/sqrt(d_k)", "none": "no divisor", "inv": "1/d_k"}


def scaled_and_unscaled(cells: list[Cell], dk, key: str) -> dict:
    """The curves of `key` (every seed) of the scaled and the unscaled cell at d_k `dk`, by SCALE_LABEL; a
    missing cell has no entry."""
    curves = {}
    for mode in ("sqrt", "none"):
        cell = pick_cell(cells, **{"model.d_k": dk, "model.scale": mode})
        if cell is not None:
            curves[SCALE_LABEL[mode]] = curve(cell, key, every_seed=True)
    return curves


def loss_vs_lr(c: Cells, out: Path) -> Path | None:
    panels = []
    sweep = c.lr_sweep
    if not sweep:
        return None
    refs = ref_lines(c.ref(sweep[0]))
    for dk in dks(sweep):
        rows = [("none", False), ("sqrt", False), ("inv", False), ("sqrt", True), ("inv", True)]
        present = [(s, ln) for s, ln in rows
                   if any(x.get("model.d_k") == dk and x.get("model.scale") == s and bool(x.get("model.qk_layernorm"))
                          == ln for x in sweep)]
        chunks = [present] if len(present) <= 4 else [present[:3], [("sqrt", False), *present[3:]]]
        for chunk in chunks:
            curves, marks = {}, {}
            for scale, ln in chunk:
                label = SCALE_LABEL[scale] + (" + QK-LN" if ln else "")
                cells = [x for x in sweep if x.get("model.d_k") == dk and x.get("model.scale") == scale
                         and bool(x.get("model.qk_layernorm")) == ln]
                pts = [(float(x.get(LR)), stat(map(loss_or_l0, x.runs)).mean, stat(map(loss_or_l0, x.runs)).std)
                       for x in cells]
                curves[label] = pts
                finite = [p for p in pts if math.isfinite(p[1])]
                if finite:
                    best = min(finite, key=lambda p: (p[1], p[0]))
                    marks[label] = (best[0], best[1])
            panels.append({"title": f"d_k {dk}" + (" (QK-LayerNorm)" if any(ln for _, ln in chunk) else ""),
                           "xlabel": "learning rate", "ylabel": "final held-out loss (nats)", "curves": curves,
                           "refs": refs, "logx": 10, "marks": marks})
    return figures.curve_panels(out / "loss_vs_lr.png", panels)


def loss_vs_dk(c: Cells, out: Path) -> Path | None:
    grid = [x for x in grid_cells(c) if is_causal(x)]
    panels = []
    if grid:
        curves = {SCALE_LABEL[s]: [(float(x.get("model.d_k")), stat(map(loss_or_l0, x.runs)).mean,
                                    stat(map(loss_or_l0, x.runs)).std) for x in grid if x.get("model.scale") == s]
                  for s in ("sqrt", "none")}
        panels.append({"title": f"at the grid's LR ({float(grid[0].get(LR)):.2g})", "xlabel": "d_k",
                       "ylabel": "final held-out loss (nats)", "curves": curves, "refs": ref_lines(c.ref(grid[0])),
                       "logx": 2})
    best = [cell for cell, _ in best_lr_cells(c.lr_sweep) if not cell.get("model.qk_layernorm")]
    if best:
        curves = {SCALE_LABEL[s]: [(float(x.get("model.d_k")), stat(map(loss_or_l0, x.runs)).mean,
                                    stat(map(loss_or_l0, x.runs)).std) for x in best if x.get("model.scale") == s]
                  for s in ("sqrt", "none")}
        panels.append({"title": "at each cell's best LR (LR sweep)", "xlabel": "d_k",
                       "ylabel": "final held-out loss (nats)", "curves": curves, "refs": ref_lines(c.ref(best[0])),
                       "logx": 2})
    return figures.curve_panels(out / "loss_vs_dk.png", panels, n_cols=2) if panels else None


def per_dk_curves(c: Cells, out: Path, name: str, keys: list[tuple[str, str, bool]], refs: bool = False
                  ) -> Path | None:
    """Panels per (key, d_k) of the grid's causal cells: scaled and unscaled lines."""
    grid = [x for x in grid_cells(c) if is_causal(x)]
    panels = []
    for key, ylabel, logy in keys:
        for dk in dks(grid):
            curves = scaled_and_unscaled(grid, dk, key)
            if any(curves.values()):
                panels.append({"title": f"{ylabel}, d_k {dk}", "ylabel": ylabel, "curves": curves, "logy": logy,
                               "refs": ref_lines(c.ref(grid[0])) if refs else {}})
    return figures.curve_panels(out / name, panels) if panels else None


def peak_vs_std(c: Cells, out: Path) -> Path | None:
    curves: dict[str, list] = {}
    for cell in c.training + c.init_only:
        if cell.get("model.scale") != "none":
            continue
        std = stat(run.at_step(mk.ATTN_SCORE_STD, 0) for run in cell.runs)
        prob = stat(run.at_step(mk.ATTN_MAX_PROB, 0) for run in cell.runs)
        if std.n and prob.n:
            curves.setdefault(f"init {cell.get('model.qk_init')}", []).append((std.mean, prob.mean, prob.std))
    if not curves:
        return None
    return figures.curve_panels(out / "max_prob_vs_score_std.png", [{
        "title": "step 0, no divisor: every init and d_k", "xlabel": "score std (attn/score_std)",
        "ylabel": "mean max probability", "curves": curves, "refs": {"0.5": 0.5}, "logx": 10}], n_cols=1)


def leak_figure(c: Cells, out: Path) -> Path | None:
    grid = grid_cells(c)
    panels = []
    for s in ("sqrt", "none"):
        curves = {"as trained (no mask)": [], "causal twin": [], "at generation (no mask)": []}
        for _, causal, open_ in twins([x for x in grid if x.get("model.scale") == s], "model.causal", True, False):
            dk = float(open_.get("model.d_k"))
            for label, cell, key in (("as trained (no mask)", open_, mk.EVAL_LOSS_AS_TRAINED),
                                     ("causal twin", causal, mk.EVAL_LOSS_AS_TRAINED),
                                     ("at generation (no mask)", open_, mk.EVAL_LOSS_GENERATION)):
                st = stat(run.last(key) for run in cell.runs)
                curves[label].append((dk, st.mean, st.std))
        if any(curves.values()):
            panels.append({"title": SCALE_LABEL[s], "xlabel": "d_k", "ylabel": "held-out loss (nats)",
                           "curves": curves, "refs": ref_lines(c.ref(grid[0])), "logx": 2})
    return figures.curve_panels(out / "leak.png", panels, n_cols=2) if panels else None


def per_step_or_probe(cells: list[Cell], per_step: str, probe: str) -> str:
    """The training batch's value at every step (train.attn_stats) where every run of the cells logged it,
    else the probe's: logit growth and collapse happen between probes."""
    runs = [run for cell in cells for run in cell.runs]
    return per_step if runs and all(run.series(per_step)[0] for run in runs) else probe


def every_step_or_probe(c: Cells, per_step: str, probe: str) -> str:
    """per_step_or_probe over the claims grid's cells."""
    return per_step_or_probe(grid_cells(c), per_step, probe)


def all_figures(c: Cells, out: Path) -> list[tuple[str, Path]]:
    """(caption, path) of every first-screen figure that has data."""
    logit = logit_key(run for cell in grid_cells(c) for run in cell.runs)  # the true maximum where logged
    entropy = every_step_or_probe(c, mk.ATTN_STEP_ENTROPY, mk.ATTN_ENTROPY)
    drawn = [
        ("final loss vs LR per d_k (best LR starred)", loss_vs_lr(c, out)),
        ("final loss vs d_k", loss_vs_dk(c, out)),
        ("training loss vs step (grid, causal)", per_dk_curves(c, out, "loss_vs_step.png",
                                                               [(mk.TRAIN_LOSS, "train/loss", False)], refs=True)),
        (f"{logit_label(logit)} and row entropy (`{entropy}`) vs step", per_dk_curves(
            c, out, "logits_entropy.png", [(logit, logit, True), (entropy, entropy, False)])),
        ("dead gradient rows and median row gradient vs step", per_dk_curves(
            c, out, "row_gradients.png", [(mk.GRAD_SCORES_DEAD_FRAC, "grad/scores_dead_frac", False),
                                          (mk.GRAD_SCORES_ROW_P50, "grad/scores_row_p50", True)])),
        ("max probability at init vs the unscaled score std", peak_vs_std(c, out)),
        ("no mask: as trained vs causal twin vs at generation", leak_figure(c, out)),
    ]
    return [(caption, path) for caption, path in drawn if path is not None]
