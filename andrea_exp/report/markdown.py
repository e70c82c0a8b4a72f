"""The report's text: header, tables, one section per claim, the LR section, attention maps; write_report."""

from __future__ import annotations

import os
import shlex
import shutil
from collections import Counter
from pathlib import Path

from andrea_exp.report import CLAIMS_FILE, REPO_DIR, figures, reference, seeds
from andrea_exp.report.cells import Cell, Experiment, group_experiments, short
from andrea_exp.report.claims import all_evidence
from andrea_exp.report.claims.common import ClaimResult
from andrea_exp.report.fixes import fixes_section
from andrea_exp.report.growth import growth_section
from andrea_exp.report.lr import lr_section
from andrea_exp.report.rules import Check
from andrea_exp.report.runs import load_runs
from andrea_exp.report.screen import (
    figures_section,
    first_screen,
    places_section,
    rules_section,
    statements,
)
from andrea_exp.report.screen_figures import all_figures
from andrea_exp.report.seeds import MIN_STEPS, is_short
from andrea_exp.report.stats import stat
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import Cells, Statement
from andrea_exp.runs import metric_keys as mk
from andrea_exp.runs import timeline
from andrea_exp.runs.code_facts import code_sha, git_facts

SHORT_WARNING = f"WARNING: some runs behind this verdict are shorter than {MIN_STEPS} steps (train.max_steps)"


class NoRuns(ValueError):
    """No run directory under the paths given: there is nothing to report."""


GPU_KEY = mk.SYSTEM_GPU  # the training loop records torch.cuda.get_device_name() there, or "cpu"


def git_commit(out: Path | None = None) -> str:
    """The report code's commit; changes under `out` (the report's own outputs) do not make it dirty."""
    facts = git_facts(REPO_DIR, ignore=out)
    if facts[mk.RUN_GIT_COMMIT] is None:
        return "unknown (not a git checkout)"
    return facts[mk.RUN_GIT_COMMIT] + (" (with uncommitted changes)" if facts[mk.RUN_GIT_DIRTY] else "")


def machine_of(runs, given: str | None = None) -> str:
    """The machine as the runs recorded it (summary `system/gpu`); runs without a record use `given`."""
    names = Counter(str(run.summary[GPU_KEY]) for run in runs if run.summary.get(GPU_KEY))
    unrecorded = sum(1 for run in runs if not run.summary.get(GPU_KEY))
    parts = [f"{name} ({n} runs, recorded in summary.json)" for name, n in names.most_common()]
    if unrecorded:
        parts.append(f"{given} ({unrecorded} runs, given with --machine: these runs do not record it)" if given
                     else f"unknown for {unrecorded} runs (they do not record {GPU_KEY}; state it with --machine)")
    return "; ".join(parts) or "no runs"


def code_of(runs) -> str:
    """The code the runs recorded (summary `run/git_commit`, `run/git_dirty`, `run/code_sha`), most runs first."""
    def label(run) -> str:
        commit = run.summary.get(mk.RUN_GIT_COMMIT)
        sha = run.summary.get(mk.RUN_CODE_SHA)
        source = f", source {sha}" if sha else ""
        if not commit:
            return f"commit not recorded{source}"
        dirty = " with uncommitted changes" if run.summary.get(mk.RUN_GIT_DIRTY) else " (clean)"
        return str(commit)[:7] + dirty + source

    return "; ".join(f"{name} ({n} runs)" for name, n in Counter(map(label, runs)).most_common()) or "no runs"


def _seeds_text(cells: list[Cell]) -> str:
    counts = Counter(len(cell.runs) for cell in cells)
    return ", ".join(f"{n} in {c} cell{'s' if c != 1 else ''}" for n, c in sorted(counts.items()))


def header(argv: list[str], study: Study, machine: str | None, notes: list[str]) -> str:
    statuses = Counter(run.status for run in study.runs)
    out = study.out.resolve()
    # relative inside the repository (experiments/results/report.md -> ../CLAIMS.md), else where it lies
    claims_link = (Path(os.path.relpath(CLAIMS_FILE, out)) if out.is_relative_to(REPO_DIR) else CLAIMS_FILE).as_posix()
    lines = ["# ANDREA attention claims: report", "",
             f"- claims: [CLAIMS.md]({claims_link}) says what each of C1-C9 states and what would show it",
             f"- command: `{' '.join(shlex.quote(a) for a in argv)}`",
             f"- report code: git commit {git_commit(out)}; source {code_sha()} (`run/code_sha` of runs made with "
             "this code)",
             f"- machine: {machine_of(study.runs, machine)}",
             f"- runs' code, as recorded in summary.json: {code_of(study.runs)}"]
    lines += [f"- note: {note}" for note in notes]
    short = [run for run in study.runs if is_short(run)]
    if short:
        lines.append(f"- WARNING: {len(short)} of {len(study.runs)} runs are shorter than {MIN_STEPS} steps "
                     f"(train.max_steps {', '.join(sorted({str(r.config.get('train.max_steps')) for r in short}))}): "
                     "too short for verdicts about training; each verdict they feed says so")
    lines += [f"- runs read: {len(study.runs)} ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items())) or 'none'})"
              f" in {len(study.experiments)} experiments, {len(study.cells)} cells", "",
              experiments_table(study.experiments), ""]
    return "\n".join(lines)


def experiments_table(experiments: list[Experiment]) -> str:
    """One row per experiment: what it can say, what tells it apart, its axes, and seeds per cell."""
    rows = []
    for e in experiments:
        setup = ", ".join(f"{short(k)}={v}" for k, v in e.setup.items()) or "-"
        seeds = sorted({run.seed for cell in e.cells for run in cell.runs}, key=str)
        rows.append([e.label, e.kind, setup, ", ".join(short(a) for a in e.axes) or "-", len(e.cells),
                     sum(len(c.runs) for c in e.cells),
                     _seeds_text(e.cells) + f" (seeds {', '.join(map(str, seeds))})"])
    use = ("Experiments (runs agreeing on every scientific setting except the study axes, whichever sweep they came "
           "from; launcher, logging, eval- and probe-cadence settings are ignored). Training experiments vote on "
           "every claim, an LR sweep's cells at their own LR and at each cell's best LR; init-only ones on the claims "
           "measured at step 0; failed runs on none.")
    return use + "\n\n" + md_table(["experiment", "kind", "settings that tell it apart", "axes", "cells", "runs",
                                      "seeds per cell"], rows)


def _run_dirs(cell: Cell) -> str:
    """'claims_grid_seeds/{0,1}, claims_grid_parallel/{0}': the sweep directory, then the job numbers."""
    by_parent: dict[str, list[str]] = {}
    for run in cell.runs + cell.excluded:
        by_parent.setdefault(run.path.parent.name, []).append(run.path.name)
    return ", ".join(f"{parent}/{{{','.join(jobs)}}}" for parent, jobs in by_parent.items())


def cells_table(cells: list[Cell]) -> str:
    rows = []
    for cell in cells:
        loss = stat(run.last(mk.EVAL_LOSS_AS_TRAINED) for run in cell.runs)
        status = Counter(run.status for run in cell.runs + cell.excluded)  # failed ones listed, not voting
        rows.append([cell.experiment, cell.label, ", ".join(map(str, cell.seeds)),
                     ", ".join(f"{k} {v}" for k, v in status.items()), str(loss), _run_dirs(cell)])
    return "## Runs and cells\n\n" + md_table(["experiment", "cell", "seeds", "status", "final held-out loss",
                                                "run dirs"], rows)


def copy_attention_maps(cells: list[Cell], out: Path) -> list[tuple[str, list[Path]]]:
    """The first and the last map of layer 0 and of the last layer, from the first seed of each cell."""
    copied = []
    for i, cell in enumerate(cells):
        if not cell.runs:
            continue
        source = cell.runs[0].path / "attention_maps"
        pngs = sorted(source.glob("*.png")) if source.is_dir() else []
        if not pngs:
            continue
        steps = sorted({p.name.split("_")[0] for p in pngs})
        chosen = [p for p in pngs if p.name.split("_")[0] in (steps[0], steps[-1])]
        target = out / "attention_maps" / f"cell{i:03d}"
        target.mkdir(parents=True, exist_ok=True)
        copied.append((f"[{cell.experiment}] {cell.label}", [Path(shutil.copy2(p, target / p.name)) for p in chosen]))
    return copied


def _where_text(where: dict) -> str:
    skip = ("part", "experiment") + (("source",) if "experiment" in where else ())
    return " ".join(f"{k}={v}" for k, v in where.items() if k not in skip) or "-"


def checks_table(checks: list[Check]) -> str:
    """Every check of a claim: part, experiment, place, the number, its threshold, pass."""
    has_part = any("part" in c.where for c in checks)
    has_exp = any("experiment" in c.where for c in checks)
    header = (["part"] if has_part else []) + (["experiment"] if has_exp else []) + \
        ["where", "value (mean ± std over seeds, n; per seed)", "threshold", "distance (> 0: passing side)",
         "within the check's threshold"]
    rows = [([c.where.get("part", "")] if has_part else []) + ([c.where.get("experiment", "")] if has_exp else []) +
            [_where_text(c.where), c.value or "-", c.threshold or "-",
             "-" if c.distance is None else float(c.distance),
             ("yes" if c.ok else "no") + ("" if c.vote else " (context)")] for c in checks]
    return md_table(header, rows)


def claim_section(result: ClaimResult, stmts: list[Statement], out: Path) -> str:
    """A claim's statements with their verdicts (the report's), then the evidence under them: per-check
    tables, figures, what was measured, notes. The checks decide nothing."""
    lines = [f"## {result.id}: {result.title}", ""]
    lines += [f"- {s.id} ({s.text}): **{s.verdict[0]}**" + (f" {s.verdict[1]}" if s.verdict[1] else "")
              for s in stmts if s.id.startswith(result.id)] + [""]
    lines += [SHORT_WARNING, ""] if any(c.short for c in result.checks) else []
    lines += ["Evidence. " + (thresholds_line(result) if result.thresholds else ""), ""]
    if result.checks:
        lines += [f"Per-check detail (evidence, not a verdict): {result.rule}", "", checks_table(result.checks), ""]
    for path in result.figures:
        rel = path.relative_to(out)
        lines += [f"Figure: ![{result.id}]({rel.as_posix()})", ""]
    if not result.figures:
        lines += ["Figure: none (nothing measured to draw)", ""]
    lines += [f"Measured: {result.measured}", ""]
    for table in result.tables:
        lines += [table, ""]
    lines += [f"Note: {note}" for note in result.notes] + ([""] if result.notes else [])
    return "\n".join(lines)


def thresholds_line(result: ClaimResult) -> str:
    """The constants the evidence's checks use."""
    return "Thresholds of the checks: " + "; ".join(f"{k} = {v}" for k, v in result.thresholds.items()) + "."


APPENDIX = "appendix.md"


def short_header(argv: list[str], study: Study, machine: str | None, notes: list[str]) -> list[str]:
    statuses = Counter(run.status for run in study.runs)
    lines = [f"- command: `{' '.join(shlex.quote(a) for a in argv)}`; report code {git_commit(study.out)}",
             f"- runs: {len(study.runs)} ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items()))}) in "
             f"{len(study.experiments)} experiments; machine: {machine_of(study.runs, machine)}",
             f"- runs' code: {code_of(study.runs)}"]
    return lines + [f"- note: {note}" for note in notes]


def write_report(roots: list[str], out: Path, argv: list[str], machine: str | None = None,
                 notes: list[str] | None = None) -> Path:
    """report.md (the first screen, figures, rules) and appendix.md (every place and check) under `out`."""
    damaged: list[str] = []
    with timeline.span("load_runs"):  # reference runs set the scale, judged nowhere
        runs, reference_runs = reference.split(load_runs(roots, damaged))
    notes = [*(notes or []), *(f"left out a damaged run: {line}" for line in damaged)]
    if not runs and damaged:
        raise NoRuns(f"every run under {', '.join(map(str, roots))} is damaged ({len(damaged)}, each named above)")
    if not runs:
        raise NoRuns(f"no runs under {', '.join(map(str, roots))} (a run directory holds .hydra/ and summary.json "
                     "or metrics.jsonl)")
    study = Study(runs, group_experiments(runs), out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    cells = Cells.of(study.cells, reference_runs)
    with timeline.span("figures"), figures.drawn_in_parallel(), timeline.span("evidence"):
        results = all_evidence(study)
        lr_text = lr_section(study.cells, study.fig("lr_sensitivity.png"), cells.refs)
        growth_text = growth_section(study.lr_cells, study.fig("logit_growth.png"), cells.refs)
        fixes_text = fixes_section(study.lr_cells, cells.refs)
        maps = copy_attention_maps(study.cells, out)
        figs = all_figures(cells, out / "figures")
    with timeline.span("statements"):
        stmts, screen_notes = statements(cells)
    report = [first_screen(cells, study.cells, stmts, screen_notes, short_header(argv, study, machine, notes or []),
                           APPENDIX), figures_section(figs, out), rules_section()]
    path = out / "report.md"
    path.write_text("\n".join(report) + "\n")
    parts = [header(argv, study, machine, notes or []).replace("# ANDREA attention claims: report",
                                                                "# ANDREA attention claims: appendix", 1),
             "[The report](report.md) holds the verdicts; this page, the detail behind them.", "",
             places_section(stmts), cells_table(study.cells), ""]
    parts += [claim_section(r, stmts, out) for r in results]
    parts.append(lr_text)
    parts.append(growth_text)
    parts.append(fixes_text)
    parts.append("## Attention maps\n")
    if maps:
        for label, paths in maps:
            parts.append(f"- {label}: " + " ".join(f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in paths))
    else:
        parts.append("No attention maps under the runs read (probe.maps_every = 0, or no probe).")
    parts.append("\n## The per-check evidence\n\n" + seeds.__doc__.split("\n\n", 1)[1].strip() + "\n")
    (out / APPENDIX).write_text("\n".join(parts) + "\n")
    return path
