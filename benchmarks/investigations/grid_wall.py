"""Wall time of a whole sweep command, as a researcher waits for it, under each `mps` setting in turn.

Runs `python -m andrea_exp -m experiment=claims_grid hydra/launcher=local_gpus cells_per_gpu=16 ...` (seed 0,
W&B off) once per --mps value and --variant (a name and its extra overrides; the plain command first),
alternating, each into a fresh sweep directory, and time-stamps every line the command prints, so the JSON
says where the time went: until Hydra launches the jobs (the launching process's start-up), until the first
model is built (worker processes, their imports, CUDA), until the last cell's training has ended, and until
the command returned. Per cell it reads run/wall_s (the training loop with its probes and evaluations) and
run/time/* from summary.json.

    PYTHONPATH=. python3 benchmarks/investigations/grid_wall.py --out /tmp/grid_wall.json          # H200: about 3 min
    PYTHONPATH=. python3 benchmarks/investigations/grid_wall.py --smoke --out /tmp/grid_wall.json  # CPU, tiny cells
    PYTHONPATH=. python3 benchmarks/investigations/grid_wall.py --mps auto --repeats 2 \
        --variant "no_probes probe.every=0" --out /tmp/grid_wall.json          # A/B/A/B: plain, without probes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from andrea_exp.runs.metric_keys import RUN_TIME
from benchmarks.common import git_commit

REPO = Path(__file__).resolve().parents[2]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mps", nargs="+", default=["auto", "false"], help="mps values to time, in this order")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the --mps values")
    parser.add_argument("--set", nargs="*", default=[], metavar="OVERRIDE", help="extra overrides for every run")
    parser.add_argument("--variant", action="append", default=[], metavar="'NAME OVERRIDE...'",
                        help="also run each round with these overrides, after the plain command (repeatable)")
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds before a run is stopped")
    parser.add_argument("--smoke", action="store_true", help="tiny cells on the CPU (for tests)")
    parser.add_argument("--keep-log", action="store_true", help="keep every time-stamped line in the JSON")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def sweep_command(sweep_dir: Path, mps: str, smoke: bool, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "andrea_exp", "-m", "experiment=claims_grid", "hydra/launcher=local_gpus",
           "cells_per_gpu=16", f"hydra.sweep.dir={sweep_dir}", "logger.mode=disabled", "train.progress=false",
           "seed=0", f"mps={mps}"]
    if smoke:  # two tiny cells on the CPU
        cmd += ["model=andrea_tiny", "data.seq_len=32", "model.d_k=8", "model.scale=true", "model.causal=true,false",
                "train.max_steps=4", "train.eval_every=2", "probe.dense_until=0", "probe.maps_every=0",
                "data.train_sequences=64", "data.eval_sequences=4", "train.sample_tokens=0", "cells_per_gpu=2"]
    return cmd + extra


def timed_lines(cmd: list[str], timeout: float) -> tuple[int, float, list[tuple[float, str]]]:
    """(exit code, wall seconds, [(seconds since start, line)]) of cmd, its stdout and stderr merged."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    lines = []
    try:
        for line in proc.stdout:
            lines.append((time.perf_counter() - started, line.rstrip("\n")))
            if time.perf_counter() - started > timeout:
                proc.kill()
                break
        code = proc.wait(timeout=max(timeout - (time.perf_counter() - started), 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    return code, time.perf_counter() - started, lines


def first(lines, marker: str) -> float | None:
    return next((t for t, text in lines if marker in text), None)


def last(lines, marker: str) -> float | None:
    return max((t for t, text in lines if marker in text), default=None)


def variants(args) -> list[tuple[str, list[str]]]:
    """[("plain", []), (NAME, overrides), ...] from --variant 'NAME OVERRIDE...'."""
    named = [v.split() for v in args.variant]
    if any(len(v) < 2 for v in named):
        raise SystemExit("--variant takes 'NAME OVERRIDE...': a name, then at least one override")
    return [("plain", []), *((v[0], v[1:]) for v in named)]


def one_run(sweep_dir: Path, mps: str, args, variant: tuple[str, list[str]] = ("plain", [])) -> dict:
    extra = [*args.set, *variant[1]]
    code, wall, lines = timed_lines(sweep_command(sweep_dir, mps, args.smoke, extra), args.timeout)
    cells = {}
    for summary in sorted(sweep_dir.glob("*/summary.json"), key=lambda p: int(p.parent.name)):
        s = json.loads(summary.read_text())
        cells[summary.parent.name] = {"status": s.get("run/status"), "wall_s": s.get("run/wall_s"),
                                      **{key: s.get(key) for key in RUN_TIME.values()}}
    return {"mps": mps, "variant": variant[0], "overrides": variant[1], "rc": code, "wall_s": round(wall, 2),
            # Hydra prints "Launching jobs" once the launching process has composed the sweep: before it is
            # that process's start-up, after it the workers' (imports, CUDA, the model)
            "jobs_launched_s": first(lines, "Launching jobs"),
            "first_model_built_s": first(lines, "[andrea-exp] model "),
            "last_training_ended_s": last(lines, "[andrea-exp] finished after"),
            "mps_lines": [text for _, text in lines if "MPS" in text], "cells": cells,
            "failed_lines": [text for _, text in lines if text.startswith("error") or "Traceback" in text][:5],
            **({"log": [f"{t:7.2f} {text}" for t, text in lines]} if args.keep_log else {})}


def main(argv=None) -> dict:
    args = parse_args(argv)
    result = {"commit": git_commit(), "command": "PYTHONPATH=. python3 benchmarks/investigations/grid_wall.py " +
              " ".join(sys.argv[1:] if argv is None else argv), "smoke": args.smoke, "runs": []}
    settings = [(mps, variant) for mps in args.mps for variant in variants(args)]  # one round, in order
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(args.repeats):
            for mps, variant in settings:
                run = one_run(Path(tmp) / f"r{round_no}_mps_{mps}_{variant[0]}", mps, args, variant)
                result["runs"].append(run)
                print(f"[grid_wall] mps={mps} {variant[0]}: {run['wall_s']:.1f} s (rc {run['rc']}), first model at "
                      f"{run['first_model_built_s']} s, last training ended at {run['last_training_ended_s']} s",
                      flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
