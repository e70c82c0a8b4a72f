"""The SLURM launcher (conf/hydra/launcher/slurm.yaml): Hydra's submitit launcher, made to survive what
clusters do.

Hydra's own launcher submits one array and then waits on each job's result in turn: the first cell that
was cancelled, timed out or ran out of memory ends it with submitit's traceback while the others run on,
and without SLURM accounting it never returns. This one checks the request against `sinfo` before
submitting, turns sbatch's refusal into one line naming the setting, waits until no job of the array is
in the queue (requeued ones included), then prints each cell's SLURM state, steps and log beside the usual
sweep table. Ctrl-C or SIGTERM while it waits says what is still running and how to cancel or collect it.
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from omegaconf import OmegaConf, open_dict

from andrea_exp.config.slurm_launcher import ON_INTERRUPT
from andrea_exp.launch import sweep
from andrea_exp.runs import run_guard
from andrea_exp.runs.rundir import HYDRA_DIR, read_summary, write_summary
from andrea_exp.training import sweep_stop

POLL_S = 2.0
SETTING = "hydra.launcher"


def refuse(problem: str) -> None:
    print(f"error: {problem}", file=sys.stderr, flush=True)
    sys.exit(2)


# ---------------------------------------------------------------- the request, before it is submitted


def _command(*args: str) -> str | None:
    """A SLURM command's output, or None when it is missing or fails."""
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _minutes(limit: str) -> float:
    """sinfo's time limit ('infinite', 'MM', 'MM:SS', 'HH:MM:SS', 'D-HH:MM:SS') in minutes."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return float("inf")
    days, _, clock = limit.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    seconds = {1: lambda: parts[0] * 60, 2: lambda: parts[0] * 60 + parts[1],
               3: lambda: parts[0] * 3600 + parts[1] * 60 + parts[2]}[len(parts)]()
    return (int(days or 0) * 86400 + seconds) / 60


def _gpus(gres: str) -> int:
    """GPUs per node in sinfo's GRES column ('gpu:2', 'gpu:a100:4(S:0-1)', '(null)')."""
    found = re.findall(r"gpu(?::[A-Za-z_][\w.-]*)?:(\d+)", gres)
    return max(map(int, found), default=0)


def request_refusal(params: dict, sinfo: str | None) -> str | None:
    """One line refusing a request that no node of the partition can run (it would pend until cancelled),
    or None. `sinfo` is `sinfo -h -o '%P|%c|%m|%G|%l'`'s output; None (no sinfo) checks only the request."""
    on_interrupt = params.get("on_interrupt", "keep")
    if on_interrupt not in ON_INTERRUPT:
        return f"{SETTING}.on_interrupt must be one of {', '.join(ON_INTERRUPT)}; got {on_interrupt!r}"
    timeout_min, delay_s = params.get("timeout_min"), params.get("signal_delay_s")
    if timeout_min and delay_s is not None and delay_s >= timeout_min * 60:
        return (f"{SETTING}.signal_delay_s={delay_s} is not shorter than {SETTING}.timeout_min={timeout_min} "
                f"({timeout_min * 60} s): the time-limit signal would come before the cell starts; set it below "
                f"{timeout_min * 60}")
    if sinfo is None:
        return None
    rows = [line.split("|") for line in sinfo.splitlines() if line.count("|") == 4]
    wanted = params.get("partition")
    names = sorted({p.rstrip("*") for p, *_ in rows})
    mine = [r for r in rows if (r[0].rstrip("*") == wanted if wanted else r[0].endswith("*"))]
    if not mine:
        if wanted:
            return f"{SETTING}.partition={wanted}: no such partition on this cluster (it has: {', '.join(names)})"
        return None  # no default partition: sbatch says so
    part = mine[0][0].rstrip("*")
    cpus = max(int(r[1].rstrip("+")) for r in mine)
    mem_mb = max(int(r[2].rstrip("+")) for r in mine)
    gpus = max(_gpus(r[3]) for r in mine)
    limit = max(_minutes(r[4]) for r in mine)
    asked_cpus = (params.get("cpus_per_task") or 1) * (params.get("tasks_per_node") or 1)
    if asked_cpus > cpus:
        return (f"{SETTING}.cpus_per_task={params.get('cpus_per_task')}: the nodes of partition {part} have at most "
                f"{cpus} CPUs")
    if params.get("mem_gb") and params["mem_gb"] * 1024 > mem_mb:
        return (f"{SETTING}.mem_gb={params['mem_gb']}: the nodes of partition {part} have at most "
                f"{mem_mb / 1024:.1f} GB ({mem_mb} MB)")
    if (params.get("gpus_per_node") or 0) > gpus:
        have = f"at most {gpus} GPUs" if gpus else "no GPUs (set 0)"
        return f"{SETTING}.gpus_per_node={params['gpus_per_node']}: the nodes of partition {part} have {have}"
    if timeout_min and timeout_min > limit:
        return f"{SETTING}.timeout_min={timeout_min}: partition {part} allows at most {limit:g} minutes"
    return None


# sbatch's words for a refused setting -> the setting; the first that matches names it
SBATCH_WORDS = (("partition", "partition"), ("gres", "gpus_per_node"), ("gpu", "gpus_per_node"),
                ("memory", "mem_gb"), ("time limit", "timeout_min"), ("qos", "qos"), ("account", "account"),
                ("feature", "constraint"), ("node configuration", "cpus_per_task, mem_gb or gpus_per_node"),
                ("cpu", "cpus_per_task"))


def sbatch_refusal(stderr: str, params: dict) -> str:
    """sbatch's refusal in one line that names the setting it refused."""
    lines = [line.split("error:", 1)[1].strip() for line in stderr.splitlines() if "error:" in line]
    why = lines[-1] if lines else stderr.strip().splitlines()[-1] if stderr.strip() else "no reason given"
    why = why.removeprefix("Batch job submission failed: ")
    text = stderr.lower()
    for words, key in SBATCH_WORDS:
        if words in text:
            setting = f"{SETTING}.{key}" + (f"={params[key]}" if key in params else "")
            return f"sbatch refused the sweep ({setting}): {why}"
    return f"sbatch refused the sweep: {why}"


# ---------------------------------------------------------------- waiting for the array


class Stopped(Exception):
    """SIGINT or SIGTERM while the launcher waits."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


def queued(array_id: str) -> set[str] | None:
    """The array's jobs still in the queue (pending, running, requeued), as 'ARRAY_TASK'; None: squeue failed."""
    try:
        proc = subprocess.run(["squeue", "-h", "-r", "-j", array_id, "-o", "%i"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:  # the controller forgot the array (every job ended long ago): nothing queued
        return set() if "Invalid job id" in proc.stderr else None
    return {line.strip() for line in proc.stdout.splitlines() if line.strip()}


def wait_for(array_id: str, poll_s: float = POLL_S) -> None:
    while True:
        left = queued(array_id)
        if left is not None and not left:
            return
        time.sleep(poll_s)


def cancel(array_id: str, signum: int, running: int) -> None:
    """hydra.launcher.on_interrupt=cancel: scancel the array and wait until its jobs have left the queue (each
    running cell stops after its step with a checkpoint). The sweep is then stopped by `signum`: its end
    prints the table and the resume command, and the command exits 128 + signum."""
    name = signal.Signals(signum).name
    print(f"[andrea-exp] {name}: cancelling SLURM array {array_id} ({running} job(s) queued or running; "
          f"{SETTING}.on_interrupt=cancel): each running cell stops after its step with a checkpoint (a second "
          "signal stops waiting for them)", file=sys.stderr, flush=True)
    sweep_stop.LAUNCHER.signum = signum
    if subprocess.run(["scancel", array_id], capture_output=True, text=True).returncode != 0:
        print(f"[andrea-exp] scancel {array_id} failed; cancel the jobs by hand", file=sys.stderr, flush=True)
    wait_for(array_id)


NOT_FINAL = ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "SUSPENDED", "RESIZING")


def final_states(array_id: str, tries: int = 10, poll_s: float = 1.0) -> dict[str, str] | None:
    """Each job's state from SLURM's accounting ('123_0' -> 'COMPLETED'); None when the cluster keeps none.
    The accounting daemon may record a job's end a moment after the queue lets it go: asked again until then."""
    for attempt in range(tries):
        out = _command("sacct", "-n", "-P", "-X", "-j", array_id, "-o", "JobID,State")
        if out is None:
            return None
        states = {}
        for line in out.splitlines():
            job, _, state = line.partition("|")
            if job and state:
                states[job] = state.split()[0]  # 'CANCELLED by 0' -> CANCELLED
        if not any(state in NOT_FINAL for state in states.values()) or attempt == tries - 1:
            return states or None
        time.sleep(poll_s)
    return None


# ---------------------------------------------------------------- the launcher


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    """In the launching process, `launch` submits and waits. In each cell's job on its node submitit loads
    the launcher, installs its own signal handlers and calls it with the cell's overrides. submitit's SIGTERM
    handler only logs "Bypassing signal SIGTERM": a scancel during the cell's set-up would be ignored and the
    cell would train on. Taken from the moment the job has loaded the launcher (before submitit's handlers,
    again after them), the signal is kept instead (sweep_stop.WORKER): the cell stops before its first step,
    or after the step it is in."""

    def __setstate__(self, state: dict) -> None:
        sweep_stop.WORKER.take()
        self.__dict__.update(state)

    def __call__(self, *args, **kwargs) -> JobReturn:
        sweep_stop.WORKER.give_back()  # submitit's bypass is not kept as the handler a second signal reaches
        sweep_stop.WORKER.take()
        return super().__call__(*args, **kwargs)

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        import submitit

        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        problem = request_refusal(self.params, _command("sinfo", "-h", "-o", "%P|%c|%m|%G|%l"))
        if problem:
            refuse(problem)
        executor = submitit_executor("slurm", self.params)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        cells, args = cell_arguments(job_overrides, initial_job_idx)
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's refusal before raising it
                jobs = executor.map_array(self, *zip(*args))
        except submitit.core.utils.FailedJobError as err:
            refuse(sbatch_refusal(str(err), self.params))
        array_id = jobs[0].job_id.split("_")[0]
        self._wait(array_id, sweep_dir, len(jobs), f"[andrea-exp] submitted SLURM array {array_id} ({len(jobs)} "
                   f"jobs); watch it with: squeue -j {array_id}; logs in {executor.folder}")
        states = final_states(array_id)
        if states is None:
            print("[andrea-exp] this cluster keeps no job accounting (sacct failed): the SLURM states are unknown; "
                  "each cell's status is its own summary's", flush=True)
        rows, returns = [], []
        for n, overrides, job in zip(cells, job_overrides, jobs):
            state = (states or {}).get(job.job_id, "unknown")
            if state not in ("COMPLETED", "unknown") and run_guard.holding(sweep_dir / str(n)).kind == run_guard.NEW:
                self._record_not_started(sweep_dir / str(n), list(overrides), state)
            summary = read_summary(sweep_dir / str(n))
            rows.append((str(n), job.job_id, state, str(summary.get("run/steps", "-")), str(job.paths.stdout)))
            returns.append(job_return(job, list(overrides), summary))
        print("\n" + format_states(array_id, rows), flush=True)
        return returns

    def _record_not_started(self, run_dir: Path, overrides: list[str], state: str) -> None:
        """A cell whose job ended before it could record anything (cancelled while Python started, a node that
        failed): a summary at step 0 and the overrides Hydra would have written, so that the table shows it,
        the command exits 1 and the sweep's resume command starts it."""
        status = "interrupted" if state == "CANCELLED" else "failed"
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(cfg):
            del cfg["hydra"]  # the cell's settings, as its summary records them
        (run_dir / HYDRA_DIR).mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(overrides), run_dir / HYDRA_DIR / "overrides.yaml")
        write_summary(run_dir, {"run/status": status, "run/steps": 0,
                                "run/error": f"not started: its SLURM job ended {state} before the cell began"}, cfg)

    def _wait(self, array_id: str, sweep_dir: Path, n_jobs: int, submitted: str) -> None:
        """Say `submitted`, then wait until no job of the array is queued; Ctrl-C or SIGTERM: say what runs on
        and how to handle it."""
        previous = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            print(submitted, flush=True)
            wait_for(array_id)
        except (Stopped, KeyboardInterrupt) as stop:
            signum = stop.signum if isinstance(stop, Stopped) else signal.SIGINT
            for s, handler in previous.items():
                signal.signal(s, handler)
            left = queued(array_id)
            if self.params.get("on_interrupt") == "cancel":
                cancel(array_id, signum, n_jobs if left is None else len(left))
                return
            print(stopped_message(signum, array_id, n_jobs if left is None else len(left), sweep_dir,
                                  sweep.sweep_resume_command(self.config, sweep_dir)), file=sys.stderr, flush=True)
            sys.exit(128 + signum)
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)



class LocalLauncher(submitit_launcher.LocalLauncher):
    """`hydra/launcher=slurm_local`: the same path with submitit's local executor. The sweep's first Ctrl-C or
    SIGTERM is taken by the launching process (sweep_stop), each running cell stops after its step with a
    checkpoint, and the launcher waits for them before the table and the resume command."""

    def launch(self, job_overrides, initial_job_idx: int) -> list[JobReturn]:
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        executor = submitit_executor("local", self.params)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        cells, args = cell_arguments(job_overrides, initial_job_idx)
        # submitit's controller of each job, a child of this process, inherits SIGINT ignored: else Ctrl-C in the
        # terminal ends it with a traceback and it kills its cell mid-step
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            jobs = executor.map_array(self, *zip(*args))
        finally:
            signal.signal(signal.SIGINT, previous)
        while not all(job.done() for job in jobs):
            time.sleep(0.2)
        return [job_return(job, list(o), read_summary(sweep_dir / str(n)))
                for n, o, job in zip(cells, job_overrides, jobs)]


def submitit_executor(cluster: str, params: dict):
    """submitit's executor with a launcher's parameters, as Hydra's own launcher builds it."""
    import submitit

    init = {"folder": params["submitit_folder"]}
    if "max_num_timeout" in params:
        init[f"{cluster}_max_num_timeout"] = params["max_num_timeout"]
    executor = submitit.AutoExecutor(cluster=cluster, **init)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"{cluster}_{k}": v for k, v in params.items()
                                  if k not in ("submitit_folder", "max_num_timeout", "on_interrupt")})
    return executor


def cell_arguments(job_overrides, initial_job_idx: int) -> tuple[list[int], list[tuple]]:
    """The cells' numbers and the arguments of each one's job (those of Hydra's own launcher)."""
    cells = [initial_job_idx + i for i in range(len(job_overrides))]
    for n, overrides in zip(cells, job_overrides):
        print(f"[andrea-exp] cell {n}: {' '.join(filter_overrides(overrides))}", flush=True)
    return cells, [(list(o), "hydra.sweep.dir", n, f"job_id_for_{n}", Singleton.get_state())
                   for o, n in zip(job_overrides, cells)]


def job_return(job, overrides: list[str], summary: dict) -> JobReturn:
    """The cell's JobReturn: the job's own when it returned one, else its summary (Hydra's sweeper raises
    on a failed JobReturn: a cell that failed is a row of the table, not the end of the sweep)."""
    from submitit.core.utils import pickle_load

    result = None
    if job.paths.result_pickle.exists():
        outcome, result = pickle_load(job.paths.result_pickle)
        if outcome != "success":
            print(f"error: cell job {job.job_id} raised: {str(result).strip().splitlines()[-1]}",
                  file=sys.stderr, flush=True)
            result = None
    if isinstance(result, JobReturn) and result.status == JobStatus.COMPLETED:
        return result
    return JobReturn(overrides=overrides, status=JobStatus.COMPLETED, _return_value=summary)


def format_states(array_id: str, rows: list[tuple[str, ...]]) -> str:
    header = ("cell", "job", "SLURM state", "steps", "log")
    counts = {}
    for row in rows:
        counts[row[2]] = counts.get(row[2], 0) + 1
    lines = [header, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    table = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in lines]
    tally = ", ".join(f"{n} {state}" for state, n in counts.items())
    return f"[andrea-exp] SLURM array {array_id}: {tally}\n" + "\n".join(table)


def stopped_message(signum: int, array_id: str, running: int, sweep_dir: Path, resume: str) -> str:
    name = signal.Signals(signum).name
    return "\n".join([
        f"[andrea-exp] {name}: the launcher stops waiting; {running} job(s) of SLURM array {array_id} are still "
        "queued or running, and go on without it",
        f"  cancel them:              scancel {array_id}",
        f"  see them:                 squeue -j {array_id}",
        f"  collect them once ended:  andrea-exp-runs {sweep_dir}   (and andrea-report {sweep_dir})",
        f"  continue unfinished cells after they end: {resume}",
    ])

