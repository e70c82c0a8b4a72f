"""The report's first screen (about 60 lines): the data box, one row per statement of the chapter with its
verdict, condition, effect size and reference, and the 12-cell grid; then the figures. Every place behind
every verdict goes to the appendix (`places_section`)."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

from andrea_exp.report.cells import Cell
from andrea_exp.report.claims.common import ClaimResult
from andrea_exp.report.effects import THRESHOLDS, References, best_lr_cells, loss_or_l0, progress_of
from andrea_exp.report.screen_figures import SCALE_LABEL, dks, grid_cells, pick_cell
from andrea_exp.report.seeds import MIN_STEPS, is_short
from andrea_exp.report.stats import stat
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import (
    Cells,
    Statement,
    c2_growth,
    c3_peaked,
    c4_stall,
    c4_vanish,
    c5_proceeds,
    c5_unit_scale,
    c7_leak,
    c9_flat,
)
from andrea_exp.runs import metric_keys as mk

# the per-check rule's words for a built-in check, in the words of the effect-size verdicts
OLD_WORDS = {"holds only under a stated condition": "holds where", "partly holds": "holds where"}
BUILT_IN = {"C1", "C6", "C8"}  # decided on the pipeline itself (no training): the same on every data source


def statements(c: Cells, old: dict[str, ClaimResult]) -> tuple[list[Statement], list[str]]:
    """Every statement in claim order, and the notes the first screen prints under the table."""
    c3, crossing = c3_peaked(c)
    stall, _ = c4_stall(c)
    out = []
    for cid in ("C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9"):
        if cid in BUILT_IN and cid in old:
            r = old[cid]
            out.append(Statement(cid, r.title, [], None, "exact check of the pipeline", "built-in",
                                 fixed_verdict=(OLD_WORDS.get(r.verdict.verdict, r.verdict.verdict),
                                                r.verdict.condition)))
        elif cid == "C2":
            out.append(c2_growth(c))
            if "C2" in old:
                r = old["C2"]
                out.append(Statement("C2b", "the magnitudes 8 / 16 / 64 at d_k 64 / 256 / 4096", [], None,
                                     "unit-variance q, k components (synthetic and the model at init)", "built-in",
                                     fixed_verdict=(OLD_WORDS.get(r.verdict.verdict, r.verdict.verdict),
                                                    r.verdict.condition)))
        elif cid == "C3":
            out.append(c3)
        elif cid == "C4":
            out += [c4_vanish(c), stall]
        elif cid == "C5":
            out += [c5_unit_scale(c), c5_proceeds(c)]
        elif cid == "C7":
            out.append(c7_leak(c))
        elif cid == "C9":
            out.append(c9_flat(c))
    notes = [f"C3: {crossing}."]
    return out, notes


def data_box(c: Cells, cells: list[Cell]) -> tuple[str, list[str]]:
    """One row per experiment that trains, and the warnings that go with the data."""
    rows, seq_lens = [], set()
    for label, refs in sorted(c.refs.items()):
        exp = [x for x in cells if x.experiment == label]
        if not exp or all((x.runs[0].config.get("train.max_steps") or 0) == 0 for x in exp):
            continue
        cfg = exp[0].runs[0].config
        source = str(cfg.get("data.name"))
        if cfg.get("data.path"):
            source += f" ({Path(str(cfg.get('data.path'))).name})"
        seq_lens.add(cfg.get("data.seq_len"))
        seeds = Counter(len(x.runs) for x in exp)
        rows.append([label, source, cfg.get("data.seq_len"), cfg.get("train.max_steps"), num(refs.floor, "unknown"),
                     num(refs.unigram), num(refs.bigram), num(refs.log_vocab), num(refs.best_causal),
                     ", ".join(f"{n}" for n in sorted(seeds))])
    table = md_table(["experiment", "source", "T", "steps", "floor", "unigram", "bigram", "log V",
                      "best causal loss", "seeds per cell"], rows)
    warnings = []
    if len(seq_lens) > 1:
        warnings.append(f"experiments differ in T ({', '.join(map(str, sorted(seq_lens)))}): each is read "
                        "against its own references")
    one_seed = [x for x in c.training + c.lr_sweep if len(x.runs) == 1]
    if one_seed:
        warnings.append(f"{len(one_seed)} cells have one seed: their effects have no interval (n=1)")
    edges = [f"{cell.label}" for cell, edge in best_lr_cells(c.lr_sweep) if edge]
    if edges:
        warnings.append(f"best LR at the edge of its sweep (the best may lie beyond it): {'; '.join(edges)}")
    short = {id(r) for x in cells for r in x.runs if is_short(r)}
    if short:
        warnings.append(f"{len(short)} runs are shorter than {MIN_STEPS} steps: too short to judge training")
    return table, warnings


def num(value, missing: str = "-") -> str:
    return missing if value is None or not math.isfinite(value) else f"{value:.3f}"


def reference_line(c: Cells) -> str:
    tops = sorted({r.top_name for r in c.refs.values()})
    return ("Progress: 0 at the experiment's bigram level (attention not used), 1 at its "
            + " / ".join(tops) + (" (an upper bound on the unknown floor)" if "best causal loss" in tops else "")
            + ". Effects: mean [95% t interval] over seeds; paired per seed with the twin where one is named.")


def verdict_table(stmts: list[Statement]) -> str:
    rows = []
    for s in stmts:
        verdict, condition = s.verdict
        effect = "-"
        if s.headline is not None:
            effect = f"{s.headline.effect.name} at {s.headline.label()}: {s.headline.effect.text()}"
        verdict = f"**{verdict}**" + (f" (runs under {MIN_STEPS} steps: too short to judge)" if s.short else "")
        rows.append([s.id, s.text, verdict, condition or "-", effect, s.reference,
                     "built-in" if s.source == "built-in" else "runs"])
    return md_table(["claim", "statement", "verdict", "condition", "effect (headline place)", "reference",
                     "rests on"], rows)


def grid_matrix(c: Cells) -> str:
    grid = grid_cells(c)
    if not grid:
        return "No claims grid among the runs (experiment=claims_grid): no matrix."
    refs: References = c.ref(grid[0])
    prog = progress_of(refs)
    cols = [(s, m) for s in ("sqrt", "none") for m in (True, False)]
    rows = []
    for dk in dks(grid):
        row = [dk]
        for s, m in cols:
            cell = pick_cell(grid, **{"model.d_k": dk, "model.scale": s, "model.causal": m})
            if cell is None:
                row.append("-")
                continue
            held = stat(map(loss_or_l0, cell.runs)).mean
            gen = stat(r.last(mk.EVAL_LOSS_GENERATION) for r in cell.runs).mean
            p = stat(map(prog, cell.runs)).mean
            row.append(f"{held:.2f} / {gen:.2f} / {p:.2f}")
        rows.append(row)
    lr = grid[0].get("train.lr")
    head = (f"The grid ({grid[0].experiment}, lr {lr}, {len(grid[0].runs)} seeds): held-out loss / at generation / "
            "progress, mean over seeds")
    return head + "\n\n" + md_table(["d_k"] + [f"{SCALE_LABEL[s]}, {'mask' if m else 'no mask'}" for s, m in cols],
                                    rows)


def first_screen(c: Cells, cells: list[Cell], stmts: list[Statement], notes: list[str], header: list[str],
                 appendix: str) -> str:
    box, warnings = data_box(c, cells)
    parts = ["# ANDREA attention claims: report", "", *header, "", "## Data", "", box, "", reference_line(c)]
    parts += [f"- WARNING: {w}" for w in warnings]
    parts += ["", "## Verdicts", "", verdict_table(stmts), ""]
    parts += [f"- {n}" for n in notes]
    parts += ["", grid_matrix(c), "",
              f"Every place behind every verdict, the per-check tables, LR sensitivity, logit growth and attention "
              f"maps: [{appendix}]({appendix}). Thresholds and rules: at the end of this page.", ""]
    return "\n".join(parts)


def figures_section(figs: list[tuple[str, Path]], out: Path) -> str:
    lines = ["## Figures", ""]
    for caption, path in figs:
        lines += [f"{caption}:", "", f"![{caption}]({os.path.relpath(path, out)})", ""]
    return "\n".join(lines)


def rules_section() -> str:
    from andrea_exp.report import effects, verdicts
    lines = ["## How verdicts are decided", "", effects.__doc__.split("\n\n", 1)[1].strip(), "",
             verdicts.__doc__.split("\n\n", 1)[1].strip(), "", "Thresholds:", ""]
    lines += [f"- {name} = {value:g}: {why}" for name, (value, why) in THRESHOLDS.items()]
    lines += ["", "C1, C6, C8 and C2's magnitudes are decided by exact checks of the pipeline (no training): "
              "the same on every data source."]
    return "\n".join(lines) + "\n"


def places_section(stmts: list[Statement]) -> str:
    """Every place of every statement, with its effect, the effects it also needs, and its decision."""
    lines = ["## Where each verdict comes from", ""]
    for s in stmts:
        if not s.places:
            continue
        verdict, condition = s.verdict
        lines += [f"### {s.id}: {s.text}: {verdict}", "", condition, ""]
        rows = [[p.label(), p.effect.name, p.effect.text(), "; ".join(f"{e.name}: {e.text()}" for e in p.also) or "-",
                 p.decision, "; ".join(f"{e.name}: {e.text()}" for e in p.shown) or "-"] for p in s.places]
        lines += [md_table(["place", "effect", "mean [95% CI] (n)", "also needed", "decision", "shown, not deciding"],
                           rows), ""]
    return "\n".join(lines)
