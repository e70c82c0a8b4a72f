"""One interface, two sinks: the run's metrics.jsonl always (through rundir), and W&B unless disabled."""

from __future__ import annotations

import contextlib
import netrc
import os
import secrets
import string
import sys
from pathlib import Path
from urllib.parse import urlsplit

from omegaconf import OmegaConf

from andrea_exp.runs import naming, rundir, timeline
from andrea_exp.runs.metric_keys import CONSTANTS, MIN_IN_SUMMARY, RUN_STATUS, TRAIN_STEP, layer_of

_said: set[str] = set()  # messages already printed in this process (a multirun's jobs may share one)
_open_runs: list = []  # W&B runs started and not yet finished in this process
TAGGED_STATUSES = ("diverged", "interrupted")  # run/status values that also become a W&B tag


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- W&B mode


def logged_in() -> bool:
    """True when W&B credentials are present (env or netrc); no network is touched."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = Path(os.environ.get("NETRC", "~/.netrc")).expanduser()
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def resolve_mode(mode: str) -> tuple[str, str]:
    """logger.mode -> (online | offline | disabled, why). `auto` honours WANDB_MODE, then the login."""
    if mode != "auto":
        return mode, f"logger.mode={mode}"
    env_mode = os.environ.get("WANDB_MODE", "").strip().lower()
    if env_mode in ("online", "offline", "disabled"):
        return env_mode, f"WANDB_MODE={env_mode}"
    if env_mode == "dryrun":
        return "offline", "WANDB_MODE=dryrun"
    if logged_in():
        return "online", "logged in to W&B"
    return "offline", "not logged in to W&B (no WANDB_API_KEY, no netrc entry)"


def offline_notice(why: str, sync_target: str, browse_target: str) -> str:
    return (f"[andrea-exp] W&B offline ({why}); runs are written locally. Upload them later with:\n"
            f"  wandb sync {sync_target}\n"
            f"  (browse in a terminal: wandb leet {browse_target})")


def finish_open_runs(failed: bool = True) -> int:
    """Finish every W&B run this process left open (a job that raised before closing its tracker)."""
    count = 0
    while _open_runs:
        run = _open_runs.pop()
        try:
            if failed:
                run.summary[RUN_STATUS] = "failed"
            run.finish(exit_code=1 if failed else 0)
        except Exception as err:  # a broken run must not break the next job
            _say_once(f"[andrea-exp] W&B: could not finish run {getattr(run, 'id', '?')}: {err}")
        count += 1
    return count


# ---------------------------------------------------------------- how the runs look in W&B

SWEEP_KEY = "sweep_name"  # W&B config key (and tag `sweep=...`) naming the sweep ("sweep" is W&B's own field)
SWEEP_WANDB_DIR = "wandb"  # <sweep dir>/wandb/: a link to every cell's W&B run, so the sweep opens and syncs as one


def job_type(cfg) -> str:
    """`train`, or `probe` for a run of no training steps (the statistics at initialisation only)."""
    return "probe" if OmegaConf.select(cfg, "train.max_steps", default=1) == 0 else "train"


def define_charts(run) -> None:
    """Every chart over the training step; held-out losses keep their lowest value (and the last) in the summary;
    the data's constants are summary numbers, not charts. Per-layer and per-head series are hidden as they
    first appear (`Tracker.log`)."""
    run.define_metric(TRAIN_STEP)
    run.define_metric("*", step_metric=TRAIN_STEP)
    for key in MIN_IN_SUMMARY:
        run.define_metric(key, step_metric=TRAIN_STEP, summary="min,last")
    for key in CONSTANTS:
        run.define_metric(key, step_metric=TRAIN_STEP, hidden=True)


def link_into_sweep(run_files: Path, sweep_dir: Path) -> Path:
    """<sweep dir>/wandb/<W&B run folder> -> the cell's own folder (a relative link: the sweep may move), so
    `wandb sync <sweep dir>/wandb` and `wandb leet <sweep dir>/wandb` take every cell at once."""
    links = sweep_dir / SWEEP_WANDB_DIR
    links.mkdir(parents=True, exist_ok=True)
    link = links / run_files.name
    with contextlib.suppress(FileExistsError):  # a resumed run's folder, linked already
        link.symlink_to(os.path.relpath(run_files, links), target_is_directory=True)
    return link


@contextlib.contextmanager
def command_line(overrides: list[str] | None):
    """W&B records the process's command line as the run's: a sweep's cell records its own overrides (what
    reruns it), not the sweep's whole command."""
    if overrides is None:
        yield
        return
    saved = sys.argv
    sys.argv = [saved[0] if saved else "andrea-exp", *overrides]
    try:
        yield
    finally:
        sys.argv = saved


def sweep_commands(sweep_dir: Path) -> str:
    """The two commands that take a sweep's W&B runs as one unit: upload, and browse in a terminal."""
    links = Path(sweep_dir) / SWEEP_WANDB_DIR
    return (f"[andrea-exp] W&B runs of the sweep, all in one folder:\n"
            f"  wandb sync {links}      # upload them (offline runs)\n"
            f"  wandb leet {links}      # browse them in a terminal")


# ---------------------------------------------------------------- Tracker


class Tracker:
    """Logs to metrics.jsonl and W&B; only the main process (rank 0) writes anything."""

    def __init__(self, run_dir: Path, cfg, *, enabled: bool = True, resume_step: int | None = None):
        self.run_dir, self.cfg, self.enabled = Path(run_dir), cfg, enabled
        self.metrics = rundir.MetricsFile(self.run_dir / rundir.METRICS_FILE, resume_step) if enabled else None
        self.wandb_run = None
        self._wandb = None
        self._charted: set[str] = set()  # keys logged to W&B so far (a per-layer key is hidden when first seen)
        self._reopened = False  # the W&B run was continued in a new service process once already
        self._pending_images: list[tuple[dict, int]] = []  # (PNGs being drawn, step), logged at finish
        if enabled:
            try:
                with timeline.span("wandb_init"):
                    self._start_wandb(resume_step)
            except Exception as err:  # W&B is the dashboard, never a reason for a run to fail
                _say_once(f"[andrea-exp] W&B disabled for this run: {type(err).__name__}: {err}")
                self.wandb_run = None

    # -- setup

    def _start_wandb(self, resume_step: int | None) -> None:
        logger = self.cfg.get("logger") or {}
        mode, why = resolve_mode(str(logger.get("mode", "auto")))
        if mode == "disabled":
            return
        os.environ.setdefault("WANDB_SILENT", "true")
        finish_open_runs(failed=True)  # a previous job in this process that never closed its run
        try:
            import wandb
        except ImportError:
            _say_once("[andrea-exp] W&B: the wandb package is not installed; logging to metrics.jsonl only")
            return
        self._wandb = wandb
        ctx = naming.job_context(self.cfg, list(logger.get("tags") or []))
        config = rundir.canonical_config(OmegaConf.to_container(self.cfg, resolve=True))
        init_args = dict(
            project=logger.get("project") or "andrea-exp",
            entity=logger.get("entity") or None,
            group=logger.get("group") or ctx.group,
            name=ctx.run_name,
            tags=ctx.tags,
            job_type=job_type(self.cfg),
            config={**config, SWEEP_KEY: ctx.sweep},
            dir=str(self.run_dir),
            id=self._run_id(resume_step),
            resume="allow" if resume_step is not None else None,
        )
        if mode == "offline" and ctx.in_sweep is False:
            _say_once(offline_notice(why, f"{self.run_dir}/wandb/offline-run-*", f"{self.run_dir}/wandb"))
        with command_line(ctx.overrides):
            run = self._init(wandb, mode, init_args)
            if run is None and mode == "online":
                run = self._init(wandb, "offline", init_args)
                if run is not None:
                    _say_once(offline_notice("W&B could not be reached", f"{self.run_dir}/wandb/offline-run-*",
                                             f"{self.run_dir}/wandb"))
        if run is None:
            return
        _open_runs.append(run)
        self.wandb_run = run
        define_charts(run)
        if ctx.sweep_dir is not None:
            link_into_sweep(Path(run.settings.sync_dir), Path(ctx.sweep_dir))

    def _run_id(self, resume_step: int | None) -> str:
        """The W&B id lives in the run directory, so a resumed run continues the same W&B run."""
        stored = rundir.read_run_id(self.run_dir) if resume_step is not None else None
        if stored:
            return stored
        run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        rundir.write_run_id(self.run_dir, run_id)
        return run_id

    @staticmethod
    def _init(wandb, mode: str, init_args: dict):
        settings = wandb.Settings(quiet=True, silent=True, show_warnings=False, init_timeout=60,
                                  reinit="create_new", x_save_requirements=False)
        try:
            return wandb.init(mode=mode, settings=settings, **init_args)
        except Exception as err:  # no network, bad entity, ...: the run itself must go on
            _say_once(f"[andrea-exp] W&B {mode} start failed: {type(err).__name__}: {err}")
            return None

    # -- logging

    def _wandb_call(self, what: str, fn) -> None:
        """Every W&B call goes through here: an error is reported once and W&B is dropped, the run goes on."""
        if self.wandb_run is None:
            return
        try:
            fn(self.wandb_run)
        except Exception as err:
            if isinstance(err, ConnectionError) and self._reopen_in_new_service():
                try:
                    fn(self.wandb_run)
                    return
                except Exception as again:
                    err = again
            if self.wandb_run is None:
                return
            _say_once(f"[andrea-exp] W&B {what} failed ({type(err).__name__}: {err}); "
                      "continuing with metrics.jsonl only")
            run, self.wandb_run = self.wandb_run, None
            if run in _open_runs:
                _open_runs.remove(run)
            with contextlib.suppress(Exception):  # already broken; closing is best effort
                run.finish(exit_code=1)

    def _reopen_in_new_service(self) -> bool:
        """W&B's service process is gone: a signal meant for the run reached it too (SLURM signals every process
        of a cancelled job, wherever its session). Close the dead connection (else its exit hook prints a
        traceback) and continue the same W&B run, by its id, in a new service, so that a stopped run still
        closes with its status and last step. Once per run; False if W&B could not start again."""
        if self._reopened:
            return False
        self._reopened = True
        dead, self.wandb_run = self.wandb_run, None
        if dead in _open_runs:
            _open_runs.remove(dead)
        with contextlib.suppress(Exception):  # the connection is broken: its teardown cannot reach the service
            self._wandb.teardown()
        print(f"[andrea-exp] W&B's service process ended; run {getattr(dead, 'id', '?')} goes on in a new one",
              file=sys.stderr, flush=True)
        self._charted = set()
        try:
            self._start_wandb(resume_step=0)  # any step: the id is read back from the run directory
        except Exception as err:
            _say_once(f"[andrea-exp] W&B could not start again: {type(err).__name__}: {err}")
            self.wandb_run = None
        return self.wandb_run is not None

    def log(self, metrics: dict, step: int) -> None:
        if not self.enabled or not metrics:
            return
        self.metrics.write(metrics, step)
        self._wandb_call("log", lambda run: (self._hide_layers(run, metrics), run.log({**metrics, TRAIN_STEP: step})))

    def _hide_layers(self, run, metrics: dict) -> None:
        """Per-layer and per-head series stay logged but out of W&B's automatic charts: the pooled ones come first
        (the workspace, runs/workspace.py, draws the layers)."""
        for key in metrics.keys() - self._charted:
            if layer_of(key) is not None:
                run.define_metric(key, step_metric=TRAIN_STEP, hidden=True)
        self._charted.update(metrics)

    def log_images(self, images: dict, step: int) -> None:
        """images: name -> PNG path, written to the run directory; or a mapping with `wait()` (the PNGs still
        being drawn, instruments/map_worker.py), logged when the run ends, in the order given."""
        if hasattr(images, "wait"):
            if self.enabled and images:
                self._pending_images.append((images, step))
            return
        if not self.enabled or not images or self.wandb_run is None:
            return
        wandb = self._wandb
        self._wandb_call("log_images", lambda run: run.log(
            {name: wandb.Image(str(path), caption=f"step {step}") for name, path in images.items()}
            | {TRAIN_STEP: step}))

    def _log_pending_images(self) -> None:
        """Every PNG still being drawn on disk, then in W&B at its step. A drawing that failed costs the maps, never
        the run: one line says so."""
        pending, self._pending_images = self._pending_images, []
        for images, step in pending:
            try:
                drawn = images.wait()
            except Exception as err:  # the maps are pictures of numbers already logged
                _say_once(f"[andrea-exp] attention maps not drawn: {type(err).__name__}: {err}")
                return
            self.log_images(drawn, step)

    def log_histograms(self, tensors: dict, step: int) -> None:
        """tensors: name -> tensor of values (e.g. attention scores); masked (non-finite) entries are dropped."""
        if not self.enabled or not tensors or self.wandb_run is None:
            return
        wandb = self._wandb

        def histograms(run):
            row = {}
            for name, values in tensors.items():
                flat = values.detach().float().flatten().cpu()
                flat = flat[flat.isfinite()]
                if flat.numel():
                    row[name] = wandb.Histogram(flat.numpy(), num_bins=64)
            if row:
                run.log(row | {TRAIN_STEP: step})

        self._wandb_call("log_histograms", histograms)

    def finish(self, summary: dict, failed: bool = False) -> None:
        """Write summary.json (with the resolved config) and close every sink; a failed run is marked failed."""
        if not self.enabled:
            return
        self._log_pending_images()
        try:
            rundir.write_summary(self.run_dir, summary, self.cfg)
        finally:
            self.metrics.close()
            run = self.wandb_run
            if run is not None:
                status = summary.get(RUN_STATUS)
                # W&B keeps the lowest and the last held-out loss itself (define_charts)
                values = {k: rundir.jsonable(v) for k, v in summary.items() if k not in ("config", *MIN_IN_SUMMARY)}
                # diverged and interrupted runs close with exit code 0 (a result, a pause): a tag tells them apart
                tags = (status,) if status in TAGGED_STATUSES else ()

                def close(r) -> None:  # one call: a run continued in a new service (above) gets all of it
                    r.summary.update(values)
                    r.tags = tuple(r.tags or ()) + tags
                    r.finish(exit_code=1 if failed else 0)

                _open_runs.remove(run)
                with timeline.span("wandb_finish"):
                    self._wandb_call("finish", close)
                if self.wandb_run in _open_runs:  # the run continued in a new service
                    _open_runs.remove(self.wandb_run)
                self.wandb_run = None
