"""The sweep's Hydra callback: says once how W&B logs the sweep, and at the end prints one table of every cell.

Naming a cell (group, run name, tags) is in runs/naming.py; the table of the cells is runs/table.py.
"""

from __future__ import annotations

import shlex
import signal
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from andrea_exp.runs import timeline
from andrea_exp.runs.table import FAILED_STATUSES, failed_of, read_cells, sweep_report
from andrea_exp.runs.tracking import SWEEP_WANDB_DIR, offline_notice, resolve_mode, sweep_commands
from andrea_exp.training import sweep_stop

_failed: list[str] = []
UNFINISHED = ("interrupted", "timeout")  # cells stopped with a checkpoint: the sweep's resume continues them


def failed_cells() -> list[str]:
    """Cells of the last sweep in this process that failed or did not finish (diverged cells are results)."""
    return list(_failed)


class SweepSummary(Callback):
    """Says once how W&B logs the sweep; at the end prints the table of every cell and remembers failures."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        timeline.mark("sweep_start")
        _failed.clear()
        if sweep_stop.runs_cells_here(config.hydra.launcher):
            sweep_stop.LAUNCHER.arm(config.hydra.sweep.dir)
        mode, why = resolve_mode(str(OmegaConf.select(config, "logger.mode", default="auto")))
        if mode == "offline":
            sweep_dir = config.hydra.sweep.dir
            print(offline_notice(why, f"{sweep_dir}/wandb", f"{sweep_dir}/wandb"), flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        with timeline.span("sweep_table"):
            self.report_end(config)

    def report_end(self, config: DictConfig) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        cells = read_cells(sweep_dir) if sweep_dir.is_dir() else []
        _failed.clear()
        unfinished = [c["dir"].name for c in cells if c["summary"].get("run/status") in UNFINISHED]
        _failed.extend(failed_of(cells) + unfinished)
        print("\n" + sweep_report(sweep_dir, cells), flush=True)
        if (sweep_dir / SWEEP_WANDB_DIR).is_dir():
            print(sweep_commands(sweep_dir), flush=True)
        sweep_stop.LAUNCHER.disarm()
        if sweep_stop.LAUNCHER.signum is not None:
            print(f"[andrea-exp] sweep stopped by {signal.Signals(sweep_stop.LAUNCHER.signum).name}; resume it with: "
                  f"{sweep_resume_command(config, sweep_dir)}", flush=True)
        elif unfinished or any(c["summary"].get("run/status") in FAILED_STATUSES for c in cells):
            print(f"[andrea-exp] {len(unfinished)} cell(s) stopped with a checkpoint, {len(failed_of(cells))} failed; "
                  f"resume them with: {sweep_resume_command(config, sweep_dir)}", flush=True)


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
