"""`python -m andrea_exp.report SWEEP_DIR... --out DIR` (`andrea-report`): runs on disk -> report.md + figures.

Reads run directories (anything under the given paths with `.hydra/` and a summary or metrics file),
groups them into cells by the axes that vary (seeds are replicates), measures the claims that need no
training directly, and writes DIR/report.md with one section per claim C1-C9, DIR/figures/*.png and
copies of the runs' attention maps.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from andrea_exp import report_rules
from andrea_exp.report_claims import ClaimResult, Study, all_claims, md_table
from andrea_exp.report_lr import lr_section
from andrea_exp.report_runs import Cell, group_cells, load_runs, stat, varying_axes

REPO_DIR = Path(__file__).resolve().parent.parent
GPU_KEYS = ("system/gpu", "system/gpu_name", "system/device", "train/device_name", "train/gpu")


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_DIR, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_DIR,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return head + (" (with uncommitted changes)" if dirty else "")


def machine_of(runs) -> str:
    """The GPU name(s) the runs recorded in their summaries, else CPU."""
    names = Counter()
    for run in runs:
        for key, value in run.summary.items():
            if (key in GPU_KEYS or "gpu" in key.lower()) and isinstance(value, str) and value:
                names[value] += 1
                break
    if not names:
        return "CPU (no GPU name recorded in the runs' summaries)"
    return ", ".join(f"{name} ({n} runs)" for name, n in names.most_common())


def header(argv: list[str], study: Study) -> str:
    seeds = Counter(len(cell.runs) for cell in study.cells)
    seeds_text = ", ".join(f"{n} seed{'s' if n != 1 else ''} in {c} cell{'s' if c != 1 else ''}"
                           for n, c in sorted(seeds.items())) or "no runs"
    statuses = Counter(run.status for run in study.runs)
    axes = varying_axes(study.runs)
    return "\n".join([
        "# ANDREA attention claims: report", "",
        f"- command: `{' '.join(shlex.quote(a) for a in argv)}`",
        f"- git commit: {git_commit()}",
        f"- machine: {machine_of(study.runs)}",
        f"- runs read: {len(study.runs)} ({', '.join(f'{k} {v}' for k, v in sorted(statuses.items())) or 'none'}) "
        f"in {len(study.cells)} cells",
        f"- seeds per cell: {seeds_text}",
        f"- axes that vary: {', '.join(axes) if axes else 'none'}", ""])


def cells_table(cells: list[Cell]) -> str:
    rows = []
    for cell in cells:
        loss = stat(run.last("eval/loss_as_trained") for run in cell.runs)
        status = Counter(run.status for run in cell.runs)
        rows.append([cell.label, len(cell.runs), ", ".join(f"{k} {v}" for k, v in status.items()), str(loss),
                     ", ".join(str(run.path) for run in cell.runs[:3]) + (" ..." if len(cell.runs) > 3 else "")])
    return "## Runs and cells\n\n" + md_table(["cell", "seeds", "status", "final held-out loss", "run dirs"], rows)


def copy_attention_maps(cells: list[Cell], out: Path) -> list[tuple[str, list[Path]]]:
    """The first and the last map of layer 0 and of the last layer, from the first seed of each cell."""
    copied = []
    for i, cell in enumerate(cells):
        source = cell.runs[0].path / "attention_maps"
        pngs = sorted(source.glob("*.png")) if source.is_dir() else []
        if not pngs:
            continue
        steps = sorted({p.name.split("_")[0] for p in pngs})
        chosen = [p for p in pngs if p.name.split("_")[0] in (steps[0], steps[-1])]
        target = out / "attention_maps" / f"cell{i:03d}"
        target.mkdir(parents=True, exist_ok=True)
        copied.append((cell.label, [Path(shutil.copy2(p, target / p.name)) for p in chosen]))
    return copied


def claim_section(result: ClaimResult, out: Path) -> str:
    v = result.verdict
    lines = [f"## {result.id}: {result.title}", "",
             f"**Verdict: {v.verdict}**" + (f" ({v.condition})" if v.condition else ""), "",
             f"Rule: {result.rule} Checks passed: {sum(c.ok for c in result.checks)} of {len(result.checks)}.", "",
             f"Measured: {result.measured}", ""]
    for table in result.tables:
        lines += [table, ""]
    lines += [f"Note: {note}" for note in result.notes] + ([""] if result.notes else [])
    for path in result.figures:
        rel = path.relative_to(out)
        lines += [f"Figure: ![{result.id}]({rel.as_posix()})", ""]
    if not result.figures:
        lines += ["Figure: none (nothing measured to draw)", ""]
    return "\n".join(lines)


def summary_table(results: list[ClaimResult]) -> str:
    rows = [[r.id, r.title, r.verdict.verdict, r.verdict.condition or ""] for r in results]
    return "## Verdicts\n\n" + md_table(["claim", "statement", "verdict", "condition / detail"], rows)


def write_report(roots: list[str], out: Path, argv: list[str]) -> Path:
    runs = load_runs(roots)
    study = Study(runs, group_cells(runs) if runs else [], out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    results = all_claims(study)
    lr_text, _ = lr_section(study.cells, study.fig("lr_sensitivity.png"))
    maps = copy_attention_maps(study.cells, out)
    parts = [header(argv, study), summary_table(results), "", cells_table(study.cells), ""]
    parts += [claim_section(r, out) for r in results]
    parts.append(lr_text)
    parts.append("## Attention maps\n")
    if maps:
        for label, paths in maps:
            parts.append(f"- {label}: " + " ".join(f"![{p.stem}]({p.relative_to(out).as_posix()})" for p in paths))
    else:
        parts.append("No attention maps under the runs read (probe.maps_every = 0, or no probe).")
    parts.append("\n## How verdicts are decided\n\n" + report_rules.__doc__.split("\n\n", 1)[1].strip() + "\n")
    path = out / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="andrea-report", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_dirs", nargs="+", help="sweep or run directories (searched recursively)")
    parser.add_argument("--out", required=True, type=Path, help="directory for report.md and figures/")
    args = parser.parse_args(argv)
    missing = [d for d in args.sweep_dirs if not Path(d).is_dir()]
    if missing:
        parser.error(f"SWEEP_DIR must be existing directories; not found: {', '.join(missing)}")
    path = write_report(args.sweep_dirs, args.out, ["andrea-report", *argv])
    print(f"[andrea-report] wrote {path}")


if __name__ == "__main__":
    main()
