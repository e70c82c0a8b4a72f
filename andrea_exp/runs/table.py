"""A finished sweep's table: every cell with its swept overrides, status, headline numbers and W&B run id.

Printed at the end of a multirun (launch.sweep's callback), after a resumed cell (launch.cli) and by
`andrea-exp-runs`; the cells' files are read through rundir.
"""

from __future__ import annotations

from pathlib import Path

from andrea_exp.runs import rundir
from andrea_exp.runs.metric_keys import ATTN_ENTROPY, EVAL_GAP, EVAL_LOSS_AS_TRAINED, RUN_ERROR, RUN_STATUS
from andrea_exp.runs.naming import split_override, sweep_axes

MISSING = "missing"  # rundir.read_summary's status for a cell that never wrote summary.json
DAMAGED = "damaged"  # a cell whose summary.json cannot be read (rundir.DamagedRun)
FAILED_STATUSES = ("failed", MISSING, DAMAGED)  # diverged cells are results, not failures
# (header, summary key) of the table's numeric columns
COLUMNS = (("final loss", EVAL_LOSS_AS_TRAINED), ("gap", EVAL_GAP), ("entropy", ATTN_ENTROPY))


def read_cells(sweep_dir: Path) -> list[dict]:
    """Every job directory of a sweep with its overrides (only the swept ones when known) and summary."""
    keys = sweep_axes(sweep_dir)
    cells = []
    for job_dir in rundir.job_dirs(sweep_dir):
        pairs = [split_override(o) for o in rundir.read_overrides(job_dir)]
        overrides = [f"{k}={v}" for k, v in pairs if not keys or k in keys]
        cells.append({"dir": job_dir, "overrides": " ".join(overrides), "summary": _summary(job_dir),
                      "wandb_id": rundir.read_run_id(job_dir)})
    return cells


def _summary(job_dir: Path) -> dict:
    """The cell's summary; a damaged one is a row of its own (status damaged, the reason as its error)."""
    try:
        return rundir.read_summary(job_dir)
    except rundir.DamagedRun as err:
        return {RUN_STATUS: DAMAGED, RUN_ERROR: str(err)}


def _num(summary: dict, key: str) -> str:
    value = summary.get(key)
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def format_table(cells: list[dict]) -> str:
    header = ("cell", "overrides", "status", *(name for name, _ in COLUMNS), "W&B id")
    rows = [header]
    for cell in cells:
        s = cell["summary"]
        rows.append((cell["dir"].name, cell["overrides"] or "(defaults)", s.get(RUN_STATUS, "?"),
                     *(_num(s, key) for _, key in COLUMNS), cell.get("wandb_id") or "-"))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    notes = []
    for c in cells:
        status, error = c["summary"].get(RUN_STATUS), c["summary"].get(RUN_ERROR)
        if status == MISSING:
            notes.append(f"  cell {c['dir'].name}: no {rundir.SUMMARY_FILE} (the job died before writing one)")
        elif status in ("failed", "diverged", DAMAGED) and error:
            notes.append(f"  cell {c['dir'].name} {status}: {error}")
    return "\n".join(lines + (["notes:", *notes] if notes else []))


def failed_of(cells: list[dict]) -> list[str]:
    return [c["dir"].name for c in cells if c["summary"].get(RUN_STATUS) in FAILED_STATUSES]


def sweep_report(sweep_dir: Path, cells: list[dict]) -> str:
    """The headline and the table printed at the end of a multirun (and by `andrea-exp-runs`)."""
    return (f"[andrea-exp] sweep {sweep_dir}: {len(cells)} cells, {len(failed_of(cells))} failed\n"
            + format_table(cells))
