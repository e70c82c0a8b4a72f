"""Where each second of four commands goes: the README's grid as typed, the claims grid in parallel, the default run
alone and the report over one grid, each timed as a whole and cut into its parts.

Each command runs as its own process with ANDREA_EXP_TIMELINE naming a file (andrea_exp.runs.timeline): every process
of the command (the launching one, the sweep's workers) appends its spans there, and the run's own phase clock
(run/time/* of each cell's summary) splits each cell's training. This script reads the spans back into parts:

- process_start_s: from the launch to the package's first line (the interpreter's start);
- imports_s: the command's modules (Hydra, OmegaConf, ... for andrea-exp; the report's for andrea-report);
- hydra_compose_s: from the imports to the first cell (or the sweep's start: Hydra composes and plans the sweep),
  then launch_s: from the sweep's start to its first cell (the launcher's workers starting);
- per cell: train_imports_s (torch and the loop, in the first cell of a process), build_s (data, model,
  optimiser, probe, step), wandb_init_s, capture_s (the CUDA graph), steps_s, probes_s, evals_s, maps_s,
  checkpoints_s, end_s (final probe, evaluation, checkpoint, sample), maps_wait_s (the end waiting for the
  PNGs still being drawn), wandb_finish_s, other_s (the rest of the Hydra job: checks, summary, the end lines);
  off_path: the seconds the maps' drawing process spent on the cell's PNGs, beside the run;
- cells_s: from the first cell's start to the last cell's end; sweep_table_s; exit_s: to the process's exit.
- the report: load_runs_s, evidence_s (every claim's numbers, figures handed to the drawing workers),
  figures_wait_s (the drawing that was still running), statements_s, then write_and_exit_s.

    PYTHONPATH=. python3 benchmarks/timeline.py --machine h200           # -> benchmarks/results/timeline_h200.json
    PYTHONPATH=. python3 benchmarks/timeline.py --machine cpu --repeats 3 --cells-per-gpu 2 \\
        --extra train.max_steps=10 --before /tmp/old                       # a CPU-sized version, beside older code

Commands run as the console scripts `andrea-exp` / `andrea-report` beside this interpreter (else as `python -m`),
with the code of --tree first on PYTHONPATH; W&B runs offline unless WANDB_MODE says otherwise. `--repeats N` runs
every command N times, one after the other, and the JSON gives the median of the wall time and of each part beside
every run's timeline.
`--before DIR` times a second checkout's code the same way (each command of it right after this tree's), for a
before/after comparison under the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks.common import git_commit

ROOT = Path(__file__).resolve().parent.parent
GRID_ARCHIVE = ROOT / "experiments" / "results" / "h200_runs.tar.xz"
GRID_MEMBER = "sweeps/claims_grid_seed0"  # the claims grid's 12 cells of seed 0, as the H200 made them
ENTRIES = ("literal", "claims_grid", "default_run", "report")
PHASES = ("setup", "steps", "probes", "evals", "maps", "checkpoints", "end")  # run/time/<phase>_s of a summary


def command_args(entry: str, cells_per_gpu: int) -> list[str]:
    """The command-line arguments of an entry, as a user types them after andrea-exp (the report's: its input)."""
    if entry == "literal":
        return ["-m", "model.d_k=64,256,4096", "model.scale=true,false", "model.causal=true,false"]
    if entry == "claims_grid":
        return ["-m", "experiment=claims_grid", "seed=0", "hydra/launcher=local_gpus", f"cells_per_gpu={cells_per_gpu}"]
    if entry == "default_run":
        return []
    raise ValueError(f"unknown entry {entry!r}; one of {', '.join(ENTRIES)}")


def read_events(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_command(argv: list[str], events_file: Path, cwd: Path, tree: Path = ROOT) -> tuple:
    """(launch, exit, pid, spans, output tail) of one process of `tree`'s code with the timeline switched on:
    launch and exit in wall-clock seconds, as the spans."""
    # the tree's code first; what PYTHONPATH held stays behind it (packages installed with --target, say)
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "ANDREA_EXP_TIMELINE": str(events_file), "PYTHONPATH": path}
    env.setdefault("WANDB_MODE", "offline")
    env.setdefault("WANDB_SILENT", "true")
    launch = time.time()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output, _ = proc.communicate()
    ended = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{output[-3000:]}")
    return launch, ended, proc.pid, read_events(events_file), output[-2000:]


def _first(events: list[dict], name: str, pid: int | None = None) -> dict | None:
    found = [e for e in events if e["name"] == name and (pid is None or e["pid"] == pid)]
    return min(found, key=lambda e: e["start"]) if found else None


def _within(events: list[dict], name: str, pid: int, start: float, end: float) -> float:
    """Seconds of the spans `name` of process `pid` inside [start, end]."""
    return sum(e["end"] - e["start"] for e in events
               if e["name"] == name and e["pid"] == pid and e["start"] >= start and e["end"] <= end)


def cell_parts(job: dict, events: list[dict]) -> dict:
    """One Hydra job (a cell, or the single run) cut into its parts; the phases are the run's own clock."""
    pid, start, end = job["pid"], job["start"], job["end"]
    ph = {p: job["phases"].get(f"run/time/{p}_s") or 0.0 for p in PHASES}
    loop = job["phases"].get("run/wall_s") or 0.0
    wandb_init = _within(events, "wandb_init", pid, start, end)
    wandb_finish = _within(events, "wandb_finish", pid, start, end)
    capture = _within(events, "capture", pid, start, end)
    maps_wait = _within(events, "maps_wait", pid, start, end)  # the run's end waiting for its maps' PNGs
    train_imports = _within(events, "train_imports", pid, start, end)
    wall = end - start
    parts = {"train_imports_s": train_imports, "build_s": max(ph["setup"] - wandb_init, 0.0),
             "wandb_init_s": wandb_init, "capture_s": capture, "steps_s": max(ph["steps"] - capture, 0.0),
             "probes_s": ph["probes"], "evals_s": ph["evals"], "maps_s": ph["maps"],
             "checkpoints_s": ph["checkpoints"], "end_s": ph["end"], "maps_wait_s": maps_wait,
             "wandb_finish_s": wandb_finish}
    parts["other_s"] = wall - train_imports - ph["setup"] - loop - ph["end"] - maps_wait - wandb_finish
    return {"cell": job.get("cell"), "pid": pid, "start_s": start, "wall_s": wall, "parts": parts,
            "off_path": {"maps_draw_s": maps_drawn(job, events)}}


def maps_drawn(job: dict, events: list[dict]) -> float | None:
    """Seconds the drawing process spent on this job's maps (its arrays lie in the job's run directory)."""
    run_dir = job.get("run_dir")
    if not run_dir:  # not recorded by the code that ran
        return None
    inside = str(Path(run_dir)) + os.sep
    return sum(e["end"] - e["start"] for e in events
               if e["name"] == "maps_draw" and str(e.get("arrays", "")).startswith(inside))


def training_timeline(launch: float, ended: float, pid: int, events: list[dict]) -> dict:
    """The parts of an andrea-exp command (one run or a sweep) from its spans."""
    main, imports = _first(events, "main", pid), _first(events, "imports", pid)
    if main is None or imports is None:
        raise RuntimeError("the command recorded no timeline (is andrea_exp.runs.timeline wired into its entry point?)")
    jobs = sorted((e for e in events if e["name"] == "job"), key=lambda e: e["start"])
    if not jobs:
        raise RuntimeError("the command ran no Hydra job")
    sweep_start, table = _first(events, "sweep_start", pid), _first(events, "sweep_table", pid)
    first_job, last_end = jobs[0]["start"], max(j["end"] for j in jobs)
    parts = {"process_start_s": main["start"] - launch, "imports_s": imports["end"] - imports["start"],
             "hydra_compose_s": (sweep_start["start"] if sweep_start else first_job) - imports["end"]}
    if sweep_start:
        parts["launch_s"] = first_job - sweep_start["start"]
    parts["cells_s"] = last_end - first_job
    if table:
        parts["sweep_table_s"] = table["end"] - table["start"]
    parts["exit_s"] = ended - max(last_end, table["end"] if table else last_end)
    cells = [cell_parts(j, events) for j in jobs]
    for c in cells:
        c["start_s"] -= launch
    totals = {k: sum(c["parts"][k] for c in cells) for k in cells[0]["parts"]}
    return {"wall_s": ended - launch, "parts": parts, "cell_totals": totals, "cells": cells,
            "unaccounted_s": ended - launch - sum(parts.values())}


def report_timeline(launch: float, ended: float, pid: int, events: list[dict]) -> dict:
    """The parts of an andrea-report command from its spans."""
    def seconds(name):
        e = _first(events, name, pid)
        if e is None:
            raise RuntimeError(f"andrea-report recorded no {name!r} span")
        return e
    main, imports, load, figs, evidence, stmts = (seconds(n) for n in
                                                  ("main", "imports", "load_runs", "figures", "evidence", "statements"))
    parts = {"process_start_s": main["start"] - launch, "imports_s": imports["end"] - imports["start"],
             "load_runs_s": load["end"] - load["start"], "evidence_s": evidence["end"] - evidence["start"],
             "figures_wait_s": figs["end"] - evidence["end"], "statements_s": stmts["end"] - stmts["start"],
             "write_and_exit_s": ended - stmts["end"]}
    return {"wall_s": ended - launch, "parts": parts, "unaccounted_s": ended - launch - sum(parts.values())}


def grid_for_report(workdir: Path) -> Path:
    """The committed claims grid (seed 0, H200) unpacked under workdir: the report's input on every machine."""
    target = workdir / GRID_MEMBER
    if not target.is_dir():
        with tarfile.open(GRID_ARCHIVE) as tar:
            members = [m for m in tar.getmembers() if m.name == GRID_MEMBER or m.name.startswith(GRID_MEMBER + "/")]
            tar.extractall(workdir, members=members, filter="data")
    return target


def command(script: str, module: str) -> list[str]:
    """The console script beside this interpreter, as a user types it (its spawned workers, unlike those of
    `python -m`, import the script's module again), else `python -m module`. Either runs the code PYTHONPATH names."""
    beside = Path(sys.executable).parent / script
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", module]


def measure(entry: str, args: argparse.Namespace, workdir: Path, repeat: int, tree: Path) -> dict:
    """One run of one entry with `tree`'s code: its command, wall time and parts."""
    workdir = workdir / ("before" if tree != args.tree else "this")
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / f"{entry}_{repeat}.events.jsonl"
    events.unlink(missing_ok=True)
    if entry == "report":
        grid = args.report_dir or grid_for_report(workdir)
        argv = [*command("andrea-report", "andrea_exp.report"), str(grid), "--out", str(workdir / f"report_{repeat}")]
        launch, ended, pid, spans, _ = run_command(argv, events, workdir, tree)
        result = report_timeline(launch, ended, pid, spans)
    else:
        given = command_args(entry, args.cells_per_gpu)
        where = workdir / f"{entry}_{repeat}"
        place = [f"hydra.sweep.dir={where}"] if "-m" in given else [f"hydra.run.dir={where}"]
        argv = [*command("andrea-exp", "andrea_exp"), *given, *args.extra, *place]
        launch, ended, pid, spans, _ = run_command(argv, events, workdir, tree)
        result = training_timeline(launch, ended, pid, spans)
    result["argv"] = [Path(argv[0]).name, *argv[1:]]
    return result


def median_of(runs: list[dict], key: str) -> dict:
    names = runs[0].get(key, {}).keys()
    return {k: statistics.median(r[key][k] for r in runs) for k in names}


def summarise(runs: list[dict], command: str) -> dict:
    out = {"command": command, "repeats": len(runs), "wall_s": statistics.median(r["wall_s"] for r in runs),
           "parts": median_of(runs, "parts")}
    if "cell_totals" in runs[0]:
        out["cell_totals"] = median_of(runs, "cell_totals")
        out["cells"] = len(runs[0]["cells"])
    out["runs"] = runs
    return out


def typed_command(entry: str, args: argparse.Namespace) -> str:
    if entry == "report":
        return f"andrea-report {args.report_dir or GRID_MEMBER + ' (experiments/results/h200_runs.tar.xz)'} --out DIR"
    return " ".join(["andrea-exp", *command_args(entry, args.cells_per_gpu), *args.extra])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", default="cpu", help="name in the output file: timeline_<machine>.json")
    parser.add_argument("--only", default=",".join(ENTRIES), help=f"comma-separated entries ({', '.join(ENTRIES)})")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each command (the JSON gives medians)")
    parser.add_argument("--cells-per-gpu", type=int, default=16, help="claims_grid's cells_per_gpu")
    parser.add_argument("--extra", nargs="*", default=[], help="overrides added to every andrea-exp command "
                        "(a CPU-sized run: train.max_steps=40)")
    parser.add_argument("--report-dir", type=Path, help="the report's input (default: the committed grid, unpacked)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code the commands run (default: "
                        "this one; another commit's, unpacked, for a before/after comparison)")
    parser.add_argument("--before", type=Path, help="also time this checkout's code, each command right after the "
                        "same command of --tree: the JSON's `before`")
    parser.add_argument("--before-commit", help="the commit --before holds, when it is no git checkout")
    parser.add_argument("--workdir", type=Path, help="where the runs go (default: a temporary folder, removed)")
    parser.add_argument("--out", type=Path, help="JSON (default: benchmarks/results/timeline_<machine>.json)")
    args = parser.parse_args(argv)
    entries = [e for e in args.only.split(",") if e]
    unknown = [e for e in entries if e not in ENTRIES]
    if unknown or not entries:
        parser.error(f"--only must name entries among {', '.join(ENTRIES)}; got {args.only!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1; got {args.repeats}")
    args.entries = entries
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / f"timeline_{args.machine}.json"
    with tempfile.TemporaryDirectory(prefix="andrea-timeline-") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        trees = [args.tree] + ([args.before] if args.before else [])
        runs = {tree: {e: [] for e in args.entries} for tree in trees}
        for repeat in range(args.repeats):  # round-robin: a noisy period spreads over every entry and both trees
            for entry in args.entries:
                for tree in trees:
                    result = measure(entry, args, workdir, repeat, tree)
                    runs[tree][entry].append(result)
                    label = " (before)" if tree != args.tree else ""
                    print(f"[timeline] {entry}{label} #{repeat}: {result['wall_s']:.1f} s  " + "  ".join(
                        f"{k} {v:.2f}" for k, v in result["parts"].items()), flush=True)
    import torch

    result = {"machine": args.machine, "commit": git_commit(args.tree),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "python": platform.python_version(),
              "torch": torch.__version__, "cpus": os.cpu_count(),
              "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "repeats": args.repeats, "extra_overrides": args.extra, "wandb_mode": os.environ.get("WANDB_MODE",
                                                                                                   "offline"),
              "entries": {e: summarise(runs[args.tree][e], typed_command(e, args)) for e in args.entries}}
    if args.before:
        result["before"] = {"tree": str(args.before), "commit": args.before_commit or git_commit(args.before),
                            "entries": {e: summarise(runs[args.before][e], typed_command(e, args))
                                        for e in args.entries}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"[timeline] wrote {out}", flush=True)
    return result


if __name__ == "__main__":
    main()
