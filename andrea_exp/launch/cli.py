"""Console entry point: `andrea-exp` / `python -m andrea_exp` is the Hydra app (`-m` sweeps).

Resuming (`train.resume=true hydra.run.dir=RUN`) never overwrites the run's original `.hydra/` files:
each resume's config and overrides go to `.hydra/resume-N/` beside them (see `resume_overrides`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from andrea_exp.config.errors import describe_os_error, unwritable
from andrea_exp.config.schema import CONF_DIR
from andrea_exp.config.validation import ConfigError, checked, command_line_error
from andrea_exp.launch import devices, gpu_memory, local_workers, orphans, slurm_job, sweep
from andrea_exp.launch.startup import interrupted_at_start_up
from andrea_exp.runs import run_guard, table, timeline, tracking
from andrea_exp.runs.end_lines import end_of_run_lines
from andrea_exp.runs.rundir import read_summary, write_summary
from andrea_exp.training import sweep_stop
from andrea_exp.training.time_limit import TIME_LIMIT, TIMEOUT_STATUS
from hydra_plugins import andrea_exp_launcher

devices.register_resolver()  # before Hydra composes conf/hydra/launcher/local_gpus.yaml
local_workers.register()  # its joblib workers survive a signal to the process group
andrea_exp_launcher.register()  # conf/hydra/launcher/slurm.yaml's launcher


def print_run_summary(summary: dict, run_dir: Path) -> None:
    print("\n".join(end_of_run_lines(summary, run_dir)))


def run_job(cfg: DictConfig) -> dict:
    """One Hydra job. In a sweep a failing cell is recorded and the sweep goes on."""
    hydra_cfg = HydraConfig.get()
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        settings = checked(cfg)  # the typed settings that train() reads
    except ConfigError as err:
        write_summary(run_dir, {"run/status": "failed", "run/error": str(err), "run/steps": 0}, cfg)
        print(f"error: {err}", file=sys.stderr)
        if in_sweep:
            return {"run/status": "failed"}
        sys.exit(2)
    held = run_guard.holding(run_dir)
    in_slurm = in_sweep and slurm_job.in_slurm_job()
    if in_slurm:
        TIME_LIMIT.take()  # before W&B's start-up, which would swallow it
        slurm_job.cap_threads()
        if slurm_job.requeued_into(run_dir):  # this job, requeued: it continues its own cell
            cfg.train.resume, cfg.train.overwrite = True, held.kind == run_guard.STOPPED  # the run's record
            settings.train.resume, settings.train.overwrite = cfg.train.resume, cfg.train.overwrite
            print(f"[andrea-exp] cell {hydra_cfg.job.num}: requeued job {slurm_job.job_key()} continues "
                  f"{run_guard.describe(held)}", flush=True)
    if _is_rank_zero():  # rank 0 alone writes the run's files; under torchrun the others may find them begun
        refused = guard_run_dir(settings, hydra_cfg, run_dir, held, in_sweep)
        if refused is not None:
            return refused
        if in_slurm:
            slurm_job.claim(run_dir)
    joblib_worker = in_sweep and sweep_stop.is_local_launcher(hydra_cfg.launcher)
    # a cell in a child process of the launching one: joblib's worker, or submitit's local job
    in_worker = joblib_worker or in_sweep and sweep_stop.is_submitit_local(hydra_cfg.launcher)
    # a sweep this machine stops cleanly: in a local worker, or in the launching process (Hydra's basic launcher)
    cells_here = in_worker or (in_sweep and sweep_stop.LAUNCHER.armed)
    if cells_here:
        sweep_dir = Path(hydra_cfg.sweep.dir)
        if in_worker:
            orphans.follow_launcher(sweep_dir)  # the worker ends, once idle, if the launching process has gone
        stopped_by = sweep_stop.requested(sweep_dir)
        if stopped_by is not None:  # Ctrl-C before this cell began: recorded, not started
            return record_not_started(cfg, run_dir, held, stopped_by)
    shares_gpu = contextlib.nullcontext(True)
    if joblib_worker:
        device = devices.assign_device(cfg, Path(hydra_cfg.sweep.dir), hydra_cfg.job.num)  # before CUDA starts
        if device is not None:
            cfg.train.device = settings.train.device = device
            if int(OmegaConf.select(cfg, "cells_per_gpu", default=1)) > 1:  # it waits until it fits on its GPU
                shares_gpu = gpu_memory.shared_gpu(sweep_dir, devices.claimed_gpu(), device, hydra_cfg.job.num,
                                                   run_dir, lambda: sweep_stop.requested(sweep_dir)
                                                   or sweep_stop.WORKER.signum)
    if in_slurm and sweep_stop.WORKER.signum is not None:  # the job was cancelled while it started: not trained
        print(f"[andrea-exp] cell {hydra_cfg.job.num}: {signal.Signals(sweep_stop.WORKER.signum).name} before its "
              "first step; not started", flush=True)
        TIME_LIMIT.ignore_from_now()
        return record_not_started(cfg, run_dir, held, sweep_stop.WORKER.signum, why="its SLURM job was cancelled")
    with timeline.span("train_imports"):  # torch imports kept out of config errors' path
        from andrea_exp.training.interrupts import Interrupted
        from andrea_exp.training.loop import AlreadyFinished, train

    try:
        with orphans.cell_running() if in_worker else contextlib.nullcontext(), shares_gpu as started:
            if not started:  # the sweep was stopped while the cell waited for room on its GPU
                return record_not_started(cfg, run_dir, held, sweep_stop.requested(sweep_dir)
                                          or sweep_stop.WORKER.signum)
            summary = train(settings, run_dir)
    except AlreadyFinished as done:
        discard_resume_record(run_dir, hydra_cfg)
        if _is_rank_zero():
            print(f"[andrea-exp] {done}", flush=True)
        return done.summary
    except Interrupted as stop:
        if in_slurm:
            return slurm_cell_stopped(stop, hydra_cfg.job.num)
        if cells_here:  # the launching process starts no more cells, prints the table and the sweep's resume line
            print(f"[andrea-exp] cell {hydra_cfg.job.num} {stop}", flush=True)
            return stop.summary
        if _is_rank_zero():
            print(f"[andrea-exp] {stop}; resume with: {resume_command(hydra_cfg, run_dir)}", flush=True)
            if in_sweep:
                sweep_dir = Path(hydra_cfg.sweep.dir)
                print(f"[andrea-exp] sweep {sweep_dir} interrupted at cell {hydra_cfg.job.num}")
                print(table.format_table(table.read_cells(sweep_dir)), flush=True)
        sys.exit(stop.exit_code)
    except Exception as err:
        tracking.finish_open_runs(failed=True)  # never let this job's W&B run leak into the next job
        if isinstance(err, ConfigError) and not in_sweep:  # e.g. a checkpoint that does not fit: files untouched
            discard_resume_record(run_dir, hydra_cfg)
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        why = describe_os_error(err) if isinstance(err, OSError) else f"{type(err).__name__}: {err}"
        if _summary_status(run_dir) != "failed":  # keep the tracker's fuller failure summary when it wrote one
            with contextlib.suppress(OSError):  # the disk that failed the run may refuse this too
                write_summary(run_dir, {"run/status": "failed", "run/error": why, "run/steps": 0}, cfg)
        if not in_sweep:
            if isinstance(err, OSError) and not full_error():
                print(f"error: {why}", file=sys.stderr)
                sys.exit(FAILURE_EXIT)
            raise
        print(f"error: cell {hydra_cfg.job.num} failed: {why}", file=sys.stderr)
        return {"run/status": "failed"}
    if in_slurm:
        slurm_job.release(run_dir)
        TIME_LIMIT.ignore_from_now()
    return summary  # the training loop printed its results while the W&B run was open


def slurm_cell_stopped(stop, cell: int) -> dict:
    """A SLURM job's cell that stopped with a checkpoint: for its time limit, submitit requeues the job (which
    continues the cell) and ends this process; else the launcher prints the sweep's resume command."""
    print(f"[andrea-exp] cell {cell} {stop}, with a checkpoint", flush=True)
    if stop.summary.get("run/status") == TIMEOUT_STATUS:
        from submitit.core.utils import UncompletedJobError

        try:
            TIME_LIMIT.hand_back()
        except UncompletedJobError:
            print(f"[andrea-exp] cell {cell}: no requeue left (hydra.launcher.max_num_timeout); the launcher "
                  "prints the sweep's resume command", flush=True)
    TIME_LIMIT.ignore_from_now()
    return stop.summary


# ---------------------------------------------------------------- runs already in the directory


def guard_run_dir(settings, hydra_cfg, run_dir: Path, held: run_guard.Holding, in_sweep: bool) -> dict | None:
    """Refuse a job that would overwrite a run, or resume one that is not there (run_guard); with
    train.overwrite=true clear the earlier run's files first. Returns the refused job's result, else None."""
    resume, overwrite = settings.train.resume, settings.train.overwrite
    problem = run_guard.refusal(run_dir, held, resume=resume, overwrite=overwrite, in_sweep=in_sweep)
    if problem is not None:  # nothing of the run is touched: no summary is written
        if in_sweep:
            print(f"error: cell {hydra_cfg.job.num} refused: {problem}", file=sys.stderr)
            return {"run/status": "failed"}
        discard_resume_record(run_dir, hydra_cfg)
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if run_guard.starts_afresh(held, resume=resume, overwrite=overwrite):
        run_guard.clear_run(run_dir, hydra_cfg.output_subdir)
        print(f"[andrea-exp] train.overwrite=true: replacing {run_guard.describe(held)} in {run_dir}", flush=True)
    return None


def record_not_started(cfg, run_dir: Path, held: run_guard.Holding, stopped_by: int,
                       why: str = "the sweep was stopped") -> dict:
    """A cell the stopped sweep never began: a new one is recorded as interrupted at step 0; one that holds a
    run already (a resumed sweep stopped again) keeps its files as they are."""
    if held.kind not in run_guard.FREE:
        return read_summary(run_dir)
    summary = {"run/status": "interrupted", "run/steps": 0,
               "run/error": f"not started: {why} by {signal.Signals(stopped_by).name}"}
    write_summary(run_dir, summary, cfg)
    return summary


def directory_refusal(argv: list[str]) -> str | None:
    """run_guard's refusal for the run or sweep directory that the command line names, before Hydra writes
    into it. A directory left to Hydra's default (a new time stamp) is checked by each job instead."""
    if any(arg.split("=")[0] in NO_RUN_FLAGS for arg in argv):
        return None
    resume, overwrite = (_is_true(_setting(argv, key) or "false") for key in ("train.resume", "train.overwrite"))
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    given = _setting(argv, "hydra.sweep.dir" if multirun else "hydra.run.dir")
    if given is None or "${" in given:
        return None
    if multirun:
        return run_guard.sweep_refusal(Path(given), resume=resume, overwrite=overwrite)
    held = run_guard.holding(Path(given))
    return run_guard.refusal(Path(given), held, resume=resume, overwrite=overwrite, in_sweep=False)


# ---------------------------------------------------------------- failures outside the settings

# Exit codes: 2 for bad settings (nothing was run), FAILURE_EXIT for a run that the file system stopped (a
# full disk, a directory it may not write, a file that disappeared), 128 + signal for an interrupt.
FAILURE_EXIT = 1  # what Hydra itself exits with when a job raises
NO_RUN_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "-sc", "--shell-completion",
                "--version"}


def full_error() -> bool:
    """HYDRA_FULL_ERROR=1: the user asked for Hydra's full traceback instead of our one line."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def output_dir_error(argv: list[str]) -> str | None:
    """One line when the run (or sweep) directory cannot be written, before Hydra tries and reports it with a
    traceback. Checked on the nearest part that exists: nothing is created here."""
    if any(arg.split("=")[0] in NO_RUN_FLAGS for arg in argv):
        return None  # --help, --cfg job, ...: Hydra prints and writes nothing
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    given = _setting(argv, key)
    fixed = (given if given is not None else "outputs").split("${")[0]  # the part before any interpolation
    where = Path(fixed or ".").expanduser().absolute()
    err = unwritable(where)
    return None if err is None else f"cannot write {where} ({key}): {err.strerror or type(err).__name__}"


# ---------------------------------------------------------------- resuming


def _is_true(value: str) -> bool:
    return value.strip().lower() in ("true", "yes", "on", "1")


def _setting(argv: list[str], key: str) -> str | None:
    """The value the command line gives `key` (last one wins), or None."""
    found = None
    for arg in argv:
        name, eq, value = arg.partition("=")
        if eq and name.lstrip("+~") == key:
            found = value
    return found


def resume_overrides(argv: list[str]) -> tuple[list[str], str | None]:
    """(extra Hydra overrides, one-line error) for a command line with train.resume=true.

    Hydra writes config.yaml, hydra.yaml and overrides.yaml into `hydra.output_subdir` (default `.hydra`)
    before the task function runs, so a resume would overwrite the record of how the run was started.
    Choosing the subdirectory per invocation, before Hydra starts, is the one clean place: a resume of a
    run that already has `.hydra/` writes to `.hydra/resume-N/` (N = 1, 2, ...), and a resume that is
    refused or finds the run finished deletes that folder again, leaving the run directory as it was.
    """
    if not _is_true(_setting(argv, "train.resume") or "false") or _setting(argv, "hydra.output_subdir") is not None:
        return [], None
    multirun = any(arg in ("-m", "--multirun") for arg in argv)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    top = _setting(argv, key)
    if top is None:
        return [], (f"train.resume=true needs {key}=DIR naming the run to continue (the default directory is "
                    "new, with a time stamp)")
    if int(os.environ.get("RANK", "0")) != 0:
        return ["hydra.output_subdir=null"], None  # under torchrun rank 0 alone records the resume
    runs = [p for p in Path(top).iterdir() if p.is_dir()] if multirun and Path(top).is_dir() else [Path(top)]
    records = [p / ".hydra" for p in runs if (p / ".hydra" / "config.yaml").is_file()]
    if not records:
        return [], None  # nothing to protect: the first start writes .hydra/ as usual
    taken = [int(d.name.split("-")[1]) for r in records for d in r.glob("resume-*") if d.name.split("-")[1].isdigit()]
    return [f"hydra.output_subdir=.hydra/resume-{max(taken, default=0) + 1}"], None


def discard_resume_record(run_dir: Path, hydra_cfg) -> None:
    """A resume that changed nothing leaves no trace: remove the .hydra/resume-N/ Hydra wrote for it."""
    subdir = hydra_cfg.output_subdir
    if subdir and Path(str(subdir)).name.startswith("resume-"):
        shutil.rmtree(run_dir / str(subdir), ignore_errors=True)


def resume_command(hydra_cfg, run_dir: Path) -> str:
    """The command that continues this run: its own overrides, train.resume=true, its run directory."""
    dropped = ("train.resume", "hydra.run.dir", "hydra.output_subdir")
    kept = sweep.overrides_without(hydra_cfg.overrides.task, dropped)
    where = f"hydra.run.dir={shlex.quote(str(run_dir))}"
    return " ".join(["andrea-exp", *map(shlex.quote, kept), "train.resume=true", where])


def _summary_status(run_dir: Path) -> str | None:
    try:
        return read_summary(run_dir).get("run/status")
    except (OSError, ValueError):
        return None


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def timed_job(cfg: DictConfig) -> dict:
    """run_job, recorded on the command's timeline (andrea_exp.runs.timeline) with the run's own phase times."""
    if not timeline.enabled():
        return run_job(cfg)
    start, summary = time.time(), None
    try:
        summary = run_job(cfg)
        return summary
    finally:
        phases = {k: v for k, v in (summary or {}).items() if k.startswith("run/time/") or k == "run/wall_s"}
        hydra_cfg = HydraConfig.get()
        cell = hydra_cfg.job.num if hydra_cfg.mode == RunMode.MULTIRUN else None
        timeline.record("job", start, time.time(), cell=cell, run_dir=hydra_cfg.runtime.output_dir, phases=phases)


_app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(timed_job)


def main() -> None:
    try:
        run_command()
    except KeyboardInterrupt:  # Ctrl-C where no training step runs to stop cleanly: one line, not a traceback
        where = interrupted_where()
        if where is None:
            interrupted_at_start_up()
        print(f"[andrea-exp] {where}", file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT)


def interrupted_where() -> str | None:
    """What a KeyboardInterrupt that reached main() cut short, in one line; None: the start-up (STARTUP)."""
    if sweep_stop.LAUNCHER.signum is not None:
        return "stopped at once by a second signal"
    interrupts = sys.modules.get("andrea_exp.training.interrupts")  # not imported before a run begins
    if interrupts is None or not interrupts.loops_begun:
        return None
    return ("interrupted by SIGINT outside a training step (the end of a run: final evaluation, checkpoint or "
            "summary); its files are as far as they got")


def run_command() -> None:
    # bad settings as one line before Hydra makes a run directory (HYDRA_FULL_ERROR=1 keeps Hydra's own report)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
        # each process would stamp its own time into the default run directory
        print("error: hydra.run.dir must be given under torchrun so every process shares one run directory "
              "(e.g. hydra.run.dir=runs/ddp)", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("HYDRA_FULL_ERROR") != "1":
        problem = command_line_error(sys.argv[1:], CONF_DIR)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
    if not full_error():
        problem = output_dir_error(sys.argv[1:])
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(FAILURE_EXIT)
    problem = directory_refusal(sys.argv[1:])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    extra, problem = resume_overrides(sys.argv[1:])
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.argv.extend(extra)
    _app()
    if sweep_stop.LAUNCHER.signum is not None:
        sys.exit(128 + sweep_stop.LAUNCHER.signum)  # as a shell reports a signal: 130 for SIGINT, 143 for SIGTERM
    if sweep.failed_cells():
        sys.exit(1)
