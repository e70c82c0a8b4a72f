"""The sweep's Hydra callback: says once how W&B logs the sweep, and at the end prints one table of every cell.

Naming a cell (group, run name, tags) is in naming.py; the files a cell leaves are read through rundir.py.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from andrea_exp.runs import rundir
from andrea_exp.runs.metric_keys import ATTN_ENTROPY, EVAL_GAP, EVAL_LOSS_AS_TRAINED, RUN_ERROR, RUN_STATUS
from andrea_exp.runs.naming import split_override, sweep_axes
from andrea_exp.runs.tracking import offline_notice, resolve_mode
from andrea_exp.training import sweep_stop

_failed: list[str] = []
MISSING = "missing"  # rundir.read_summary's status for a cell that never wrote summary.json
FAILED_STATUSES = ("failed", MISSING)  # diverged cells are results, not failures
# (header, summary key) of the table's numeric columns
COLUMNS = (("final loss", EVAL_LOSS_AS_TRAINED), ("gap", EVAL_GAP), ("entropy", ATTN_ENTROPY))


def failed_cells() -> list[str]:
    """Cells of the last sweep in this process that failed (diverged cells are results, not failures)."""
    return list(_failed)


def read_cells(sweep_dir: Path) -> list[dict]:
    """Every job directory of a sweep with its overrides (only the swept ones when known) and summary."""
    keys = sweep_axes(sweep_dir)
    cells = []
    for job_dir in rundir.job_dirs(sweep_dir):
        pairs = [split_override(o) for o in rundir.read_overrides(job_dir)]
        overrides = [f"{k}={v}" for k, v in pairs if not keys or k in keys]
        cells.append({"dir": job_dir, "overrides": " ".join(overrides), "summary": rundir.read_summary(job_dir)})
    return cells


def _num(summary: dict, key: str) -> str:
    value = summary.get(key)
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def format_table(cells: list[dict]) -> str:
    header = ("cell", "overrides", "status", *(name for name, _ in COLUMNS))
    rows = [header]
    for cell in cells:
        s = cell["summary"]
        rows.append((cell["dir"].name, cell["overrides"] or "(defaults)", s.get(RUN_STATUS, "?"),
                     *(_num(s, key) for _, key in COLUMNS)))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    notes = []
    for c in cells:
        status, error = c["summary"].get(RUN_STATUS), c["summary"].get(RUN_ERROR)
        if status == MISSING:
            notes.append(f"  cell {c['dir'].name}: no {rundir.SUMMARY_FILE} (the job died before writing one)")
        elif status in ("failed", "diverged") and error:
            notes.append(f"  cell {c['dir'].name} {status}: {error}")
    return "\n".join(lines + (["notes:", *notes] if notes else []))


def failed_of(cells: list[dict]) -> list[str]:
    return [c["dir"].name for c in cells if c["summary"].get(RUN_STATUS) in FAILED_STATUSES]


def sweep_report(sweep_dir: Path, cells: list[dict]) -> str:
    """The headline and the table printed at the end of a multirun (and by `andrea-exp-runs`)."""
    return (f"[andrea-exp] sweep {sweep_dir}: {len(cells)} cells, {len(failed_of(cells))} failed\n"
            + format_table(cells))


class SweepSummary(Callback):
    """Says once how W&B logs the sweep; at the end prints the table of every cell and remembers failures."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _failed.clear()
        if sweep_stop.runs_cells_here(config.hydra.launcher):
            sweep_stop.LAUNCHER.arm(config.hydra.sweep.dir)
        mode, why = resolve_mode(str(OmegaConf.select(config, "logger.mode", default="auto")))
        if mode == "offline":
            sweep_dir = config.hydra.sweep.dir
            print(offline_notice(why, f"{sweep_dir}/*/wandb/offline-run-*", f"{sweep_dir}/0/wandb"), flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        cells = read_cells(sweep_dir) if sweep_dir.is_dir() else []
        _failed.clear()
        _failed.extend(failed_of(cells))
        print("\n" + sweep_report(sweep_dir, cells), flush=True)
        sweep_stop.LAUNCHER.disarm()
        if sweep_stop.LAUNCHER.signum is not None:
            print(f"[andrea-exp] sweep stopped by {signal.Signals(sweep_stop.LAUNCHER.signum).name}; resume it with: "
                  f"{sweep_resume_command(config, sweep_dir)}", flush=True)


# set by Hydra or by the resume itself: the resume line names the sweep directory and -m instead
_NOT_REPEATED = ("hydra.mode", "hydra.sweep.dir", "hydra.output_subdir", "train.resume")


def overrides_without(overrides, names) -> list[str]:
    """The command-line overrides that set none of `names` (a `+` or `~` prefix counts as the name)."""
    return [str(o) for o in overrides if str(o).partition("=")[0].lstrip("+~") not in names]


def sweep_resume_command(config: DictConfig, sweep_dir: Path) -> str:
    """The command that resumes a stopped sweep: its own overrides (Hydra's and the task's, sweep axes as
    given), train.resume=true and its sweep directory. Cells that finished are left as they are."""
    kept = overrides_without([*config.hydra.overrides.hydra, *config.hydra.overrides.task], _NOT_REPEATED)
    return " ".join(["andrea-exp", "-m", *map(shlex.quote, kept), "train.resume=true",
                     f"hydra.sweep.dir={shlex.quote(str(sweep_dir))}"])
