"""Where one claims-grid cell's time goes: the training step, a held-out evaluation, a probe.

For each (d_k, mask) cell of the claims grid (andrea_small, seq_len 128, batch 32, scaled), in one process:
the step as train() builds it (CUDA-graphed where it can be), one evaluate() call (both eval losses;
without the mask that is one forward per prefix), and one Probe.measure(). With --profile, the CUDA
kernels of a few eager steps of the largest d_k, sorted by time. Prints a line per cell and writes JSON.

    PYTHONPATH=. python3 benchmarks/investigations/cell_breakdown.py --out /tmp/breakdown.json [--profile]
    PYTHONPATH=. python3 benchmarks/investigations/cell_breakdown.py --smoke --out /tmp/x.json   # CPU, tiny
    PYTHONPATH=. python3 benchmarks/investigations/cell_breakdown.py --smoke --device cuda --profile --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from andrea_exp.instruments.evaluate import evaluate
from andrea_exp.instruments.probe import Probe
from benchmarks.claims_grid_speed import cell_overrides
from benchmarks.common import compose_cfg, git_commit, timed, warmed_cell


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, on the CPU unless --device cuda")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="with --smoke: default cpu")
    parser.add_argument("--d-k", type=int, nargs="+", default=[64, 256, 4096])
    parser.add_argument("--steps", type=int, default=50, help="timed steps per cell")
    parser.add_argument("--repeats", type=int, default=3, help="timed evaluations and probes per cell")
    parser.add_argument("--profile", action="store_true", help="print the top CUDA kernels of the largest d_k")
    parser.add_argument("--set", nargs="*", default=[], metavar="OVERRIDE",
                        help="extra Hydra overrides for every cell, e.g. model.attn_impl=fused")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


def measure_cell(overrides: list[str], steps: int, repeats: int) -> dict:
    cfg = compose_cfg(overrides)
    cell, batches = warmed_cell(cfg, steps)
    sync = torch.cuda.synchronize if cell.rt.device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    for x, y in batches:
        cell.step(x, y)
    sync()
    step_s = (time.perf_counter() - started) / steps
    data = cell.data

    def run_eval():
        with cell.rt.autocast():
            evaluate(cell.model, data.eval.tokens, data.floor, data.floor_standard_error)

    probe = Probe(cell.model, data.eval.tokens[: cfg.probe.batch_size], cfg.probe, Path("/tmp"))
    return {"step_ms": 1e3 * step_s, "eval_s": timed(run_eval, repeats, sync),
            "probe_s": timed(lambda: probe.measure(0), repeats, sync)}


def profile_steps(overrides: list[str], steps: int = 5) -> str:
    cfg = compose_cfg(overrides + ["train.cuda_graph=false"])
    cell, batches = warmed_cell(cfg, steps, warmup_steps=3)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for x, y in batches:
            cell.step(x, y)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.d_k, args.steps, args.repeats = [4, 8], 3, 1
        args.device = args.device or "cpu"
        args.profile = args.profile and args.device == "cuda"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else "cpu"
    result = {"commit": git_commit(), "overrides": args.set, "gpu": gpu,
              "cells": {}}

    def overrides_of(d_k: int, causal: bool = True) -> list[str]:
        tiny = ["model.n_head=2", "model.d_v=4"] if args.smoke else []
        return [*cell_overrides(d_k, args.smoke, args.device), f"model.causal={str(causal).lower()}", *args.set,
                *tiny]

    for d_k in args.d_k:
        for causal in (True, False):
            cell = measure_cell(overrides_of(d_k, causal), args.steps, args.repeats)
            name = f"d_k={d_k} {'causal' if causal else 'unmasked'}"
            result["cells"][name] = cell
            print(f"[cell-breakdown] {name}: step {cell['step_ms']:.2f} ms, eval {cell['eval_s']:.3f} s, "
                  f"probe {cell['probe_s']:.3f} s", flush=True)
    if args.profile and torch.cuda.is_available():
        print(profile_steps(overrides_of(max(args.d_k))), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
