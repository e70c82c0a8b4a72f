"""What a run directory already holds, and whether a command may train into it.

A run that finished, diverged or was stopped is never overwritten without being asked
(`train.overwrite=true`), and `train.resume=true` only continues a run that is there: a mistyped directory
is refused, not trained from scratch. Checked twice: by the command line's run or sweep directory before
Hydra writes anything into it (`andrea_exp.launch.cli.directory_refusal`), and by each job once its settings are
composed (`refusal`). Free of torch: the launching process of a sweep never imports it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from andrea_exp.runs import rundir

# what a run directory holds
NEW = "new"                  # nothing of a run: no summary, no records, no checkpoint (at most Hydra's .hydra/)
NOT_STARTED = "not started"  # a summary at step 0 and nothing else: a sweep stopped, or a setting refused, before it
FINISHED = "finished"
DIVERGED = "diverged"
RESUMABLE = "resumable"      # a checkpoint to continue from, and not finished
STOPPED = "stopped"          # records of steps, no checkpoint: killed or failed before its first checkpoint
DONE = (FINISHED, DIVERGED)  # results: a resume leaves them as they are
LABELS = {NEW: "new", NOT_STARTED: "not started", FINISHED: "finished", DIVERGED: "diverged",
          RESUMABLE: "interrupted", STOPPED: "stopped before a checkpoint"}
FREE = (NEW, NOT_STARTED)    # nothing is lost by training here


@dataclass(frozen=True)
class Holding:
    kind: str
    status: str | None = None  # summary.json's run/status, when there is one
    steps: int | None = None   # summary.json's run/steps, when there is one


def _summary(run_dir: Path) -> dict:
    try:
        summary = json.loads((run_dir / rundir.SUMMARY_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _has_records(run_dir: Path) -> bool:
    try:
        return (run_dir / rundir.METRICS_FILE).stat().st_size > 0
    except OSError:
        return False


def holding(run_dir: Path) -> Holding:
    """What `run_dir` holds: NEW, NOT_STARTED, FINISHED, DIVERGED, RESUMABLE or STOPPED."""
    run_dir = Path(run_dir)
    summary = _summary(run_dir)
    status, steps = summary.get("run/status"), summary.get("run/steps")
    if status in DONE:
        kind = status
    elif (run_dir / rundir.CHECKPOINT_DIR / "latest.pt").is_file():
        kind = RESUMABLE
    elif _has_records(run_dir) or (steps or 0) > 0:
        kind = STOPPED
    else:
        kind = NOT_STARTED if summary else NEW
    return Holding(kind, status, steps)


def describe(held: Holding) -> str:
    """`a finished run (600 steps)`, `a run interrupted at step 300`, ...: what the one-line refusals name."""
    at = f" at step {held.steps}" if held.steps is not None else ""
    if held.kind == FINISHED:
        return f"a finished run ({held.steps} steps)"
    if held.kind == DIVERGED:
        return f"a run that diverged{at}"
    if held.kind == RESUMABLE:
        if held.status == "interrupted":
            return f"a run interrupted{at}"
        if held.status == "timeout":
            return f"a run stopped for its time limit{at}"
        return f"a run that failed{at}, with a checkpoint" if held.status == "failed" else \
            "a run that stopped with a checkpoint and no summary (killed?)"
    if held.kind == STOPPED:
        return f"a run that {'failed' if held.status == 'failed' else 'stopped'}{at} before its first checkpoint" \
            if held.status else "a run that stopped before writing a checkpoint or a summary"
    return "no run"


def refusal(run_dir: Path, held: Holding, *, resume: bool, overwrite: bool, in_sweep: bool,
            key: str = "hydra.run.dir") -> str | None:
    """The one line that refuses this command for this run directory, or None when it may go on.

    Without train.resume: a directory that holds a run is refused unless train.overwrite=true. With it: a
    run with a checkpoint continues, a finished or diverged one is left as it is (said later, by the loop),
    and one with nothing to continue from is refused, unless train.overwrite=true asks for a fresh start;
    a sweep's cell that never started starts from step 0.
    """
    where = f"{key}={run_dir}"
    if overwrite or held.kind in FREE and not resume:
        return None
    if not resume:
        resume_hint = "pass train.resume=true to continue it, " if held.kind == RESUMABLE else ""
        return (f"{where} already holds {describe(held)}: {resume_hint}choose a new {key}, or pass "
                "train.overwrite=true to replace it")
    if held.kind == NEW and not in_sweep:
        return (f"train.resume=true: {where} holds no run to continue (no summary.json, metrics.jsonl or "
                f"checkpoints/latest.pt); check the directory, or leave out train.resume to start a new run")
    if held.kind == STOPPED:
        return (f"train.resume=true: {where} holds {describe(held)}, so there is nothing to continue from; "
                "pass train.overwrite=true to start it again from step 0, or choose a new run directory")
    return None


def starts_afresh(held: Holding, *, resume: bool, overwrite: bool) -> bool:
    """Whether an allowed command trains this directory from step 0 over a run (train.overwrite=true)."""
    if not overwrite or held.kind in FREE:
        return False
    return not resume or held.kind == STOPPED


# the files of a run that a fresh start replaces; W&B's own folder keeps its runs under their ids
RUN_FILES = (rundir.SUMMARY_FILE, rundir.METRICS_FILE, rundir.RUN_ID_FILE)
RUN_DIRS = (rundir.CHECKPOINT_DIR, rundir.MAPS_DIR)


def clear_run(run_dir: Path, hydra_subdir: str | None) -> None:
    """Remove what an earlier run left (train.overwrite=true), so that no old checkpoint or record mixes into the
    new run. Hydra has written this command's record already (`hydra_subdir`); earlier resumes' go."""
    run_dir = Path(run_dir)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(run_dir / name, ignore_errors=True)
    ours = run_dir / hydra_subdir if hydra_subdir else None
    for old in (run_dir / rundir.HYDRA_DIR).glob("resume-*"):
        if old != ours:
            shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------- a whole sweep, before Hydra writes anything


def sweep_refusal(sweep_dir: Path, *, resume: bool, overwrite: bool) -> str | None:
    """One line for a sweep directory: cells that hold runs (without train.resume); a directory with no sweep
    in it, or cells with nothing to continue from (with it). Cells not there yet are new."""
    key = "hydra.sweep.dir"
    cells = rundir.job_dirs(sweep_dir) if sweep_dir.is_dir() else []
    if resume and not overwrite and not cells and not (sweep_dir / rundir.MULTIRUN_FILE).is_file():
        return (f"train.resume=true: {key}={sweep_dir} holds no sweep to continue (no {rundir.MULTIRUN_FILE}, no "
                "cell directories); check the directory, or leave out train.resume to start a new sweep")
    held = {cell.name: holding(cell) for cell in cells}
    refused = [name for name, h in held.items()
               if refusal(sweep_dir / name, h, resume=resume, overwrite=overwrite, in_sweep=True)]
    if not refused:
        return None
    kinds = [LABELS[h.kind] for h in held.values()]
    what = ", ".join(f"{kinds.count(kind)} {kind}" for kind in dict.fromkeys(kinds))
    if not resume:
        unfinished = any(h.kind not in DONE for h in held.values())
        resume_hint = "pass train.resume=true to continue it, " if unfinished else ""
        return (f"{key}={sweep_dir} already holds a sweep ({len(held)} cells: {what}): {resume_hint}choose a new "
                f"{key}, or pass train.overwrite=true to replace its cells")
    return (f"train.resume=true: cell{'s' if len(refused) > 1 else ''} {', '.join(refused)} of {key}={sweep_dir} "
            f"stopped before a first checkpoint, so there is nothing to continue from; pass train.overwrite=true "
            "to start such cells again from step 0")
