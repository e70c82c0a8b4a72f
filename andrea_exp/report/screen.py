"""The report's first screen (about 60 lines): the data box, one row per statement of the chapter with its
verdict, condition, effect size and reference, and the 12-cell grid; then the figures. Every place behind
every verdict goes to the appendix (`places_section`)."""

from __future__ import annotations

import math
import os
from collections import Counter
from pathlib import Path

from andrea_exp.report.bestlr import best_lr_cells
from andrea_exp.report.cells import INIT_ONLY, Cell, failed_lines
from andrea_exp.report.claims import all_statements
from andrea_exp.report.effects import THRESHOLDS, References, loss_or_l0, progress_of
from andrea_exp.report.reference import describe
from andrea_exp.report.repeats import data_warnings
from andrea_exp.report.screen_figures import SCALE_LABEL, dks, grid_cells, pick_cell
from andrea_exp.report.seeds import MIN_STEPS, distinct_cells, is_short
from andrea_exp.report.stats import stat
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import Cells, Statement
from andrea_exp.runs import metric_keys as mk


def statements(c: Cells) -> tuple[list[Statement], list[str]]:
    """Every statement in claim order (the claims' registry), and the notes the first screen prints under the
    table."""
    out = all_statements(c)
    return out, [f"{s.id}: {note}." for s in out for note in s.notes]


def data_box(c: Cells, cells: list[Cell]) -> tuple[str, list[str]]:
    """One row per experiment that trains, and the warnings that go with the data."""
    rows, seq_lens = [], set()
    for label, refs in sorted(c.refs.items()):
        exp = [x for x in cells if x.experiment == label]
        if not exp or all((x.get("train.max_steps") or 0) == 0 for x in exp):
            continue
        cfg = (exp[0].runs or exp[0].excluded)[0].config
        source = str(cfg.get("data.name"))
        if cfg.get("data.path"):
            source += f" ({Path(str(cfg.get('data.path'))).name})"
        seq_lens.add(cfg.get("data.seq_len"))
        seeds = Counter(len(x.runs) for x in exp)
        rows.append([label, source, cfg.get("data.seq_len"), cfg.get("train.max_steps"), num(refs.floor, "unknown"),
                     num(refs.unigram), num(refs.bigram), num(refs.log_vocab), reference_text(refs),
                     ", ".join(f"{n}" for n in sorted(seeds))])
    table = md_table(["experiment", "source", "T", "steps", "floor", "unigram", "bigram", "log V",
                      "reference run (progress 1 without a floor)", "seeds per cell"], rows)
    warnings = []
    if len(seq_lens) > 1:
        warnings.append(f"experiments differ in T ({', '.join(map(str, sorted(seq_lens)))}): each is read "
                        "against its own references")
    one_seed = [x for x in {id(x): x for x in c.training + c.lr_sweep}.values() if len(x.runs) == 1]
    if one_seed:
        warnings.append(f"{len(one_seed)} cells have one seed: their effects have no interval (n=1)")
    edges = [f"{cell.label}" for cell, edge in best_lr_cells(c.lr_sweep) if edge]
    if edges:
        warnings.append(f"best LR at the edge of its sweep (the best may lie beyond it): {'; '.join(edges)}")
    warnings += failed_lines(cells)
    short = {id(r) for x in cells for r in x.runs if is_short(r)}
    if short:
        warnings.append(f"{len(short)} runs are shorter than {MIN_STEPS} steps: too short to judge training")
    warnings += data_warnings([r for x in distinct_cells(cells) for r in x.runs if x.kind != INIT_ONLY])
    return table, warnings


def reference_text(refs: References) -> str:
    """The reference runs' loss and what they are; never a judged cell's."""
    if refs.reference is None:
        return "none" + (" (not needed: floor known)" if refs.floor is not None else ": progress not measured")
    return f"{refs.reference:.3f} ({describe(refs.reference_runs)}; not judged)"


def num(value, missing: str = "-") -> str:
    return missing if value is None or not math.isfinite(value) else f"{value:.3f}"


def reference_line(c: Cells) -> str:
    tops = sorted({r.top_name for r in c.refs.values()})
    top = " / ".join(t for t in tops if t != "none")
    return ("Progress: 0 at the experiment's bigram level (attention not used), 1 at its " + (top or "-")
            + (" (a run trained for that purpose and judged nowhere: an upper bound on the unknown floor)"
               if "reference run" in tops else "")
            + ("; where the data has no floor and no reference run, progress is not measured" if "none" in tops
               else "")
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
            if m:  # progress reads the causal loss; an unmasked cell's loss is the leak's, shown as the leak
                p = stat(map(prog, cell.runs))
                row.append(f"{held:.2f} / {gen:.2f} / {p.mean:.2f}" if p.n else f"{held:.2f} / {gen:.2f} / -")
            else:
                twin = pick_cell(grid, **{"model.d_k": dk, "model.scale": s, "model.causal": True})
                leak = stat(map(loss_or_l0, twin.runs)).mean - held if twin is not None else math.nan
                row.append(f"{held:.2f} / {gen:.2f} / leak {leak:.2f}")
        rows.append(row)
    lr = grid[0].get("train.lr")
    head = (f"The grid ({grid[0].experiment}, lr {lr}, {len(grid[0].runs)} seeds): held-out loss / at generation / "
            "progress (masked cells) or leak: the causal twin's loss minus this one (unmasked), mean over seeds")
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
              "each check is a place decided on its own signed distance from its threshold; the same on every "
              "data source."]
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
                 p.decision_text, "; ".join(f"{e.name}: {e.text()}" for e in p.shown) or "-"] for p in s.places]
        lines += [md_table(["place", "effect", "mean [95% CI] (n)", "also needed", "decision", "shown, not deciding"],
                           rows), ""]
    return "\n".join(lines)
