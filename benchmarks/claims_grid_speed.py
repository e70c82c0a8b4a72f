"""Per-step time of one claims-grid cell (andrea_small, seq_len 128, batch 32), eager against a CUDA graph.

For d_k 64 and d_k 4096 (scaled, causal), in one process: the eager step of andrea_exp.training.loop and the
replayed graph of andrea_exp.training.graphed_step, each on a fresh model from the same seed and the same batches,
beside the arithmetic bound of the step:

    FLOPs/step = 6 * params * tokens + 6 * n_layer * batch * n_head * T^2 * (d_k + d_v)

(6 = forward 2 + backward 4 per multiply-add; the second term is Q K^T and P V, full T x T as the
explicit path computes it) at an assumed dense bf16 rate (--tflops, printed). Also the largest
difference between the two modes' losses over the timed steps, beside that between two eager runs:
GPU training is not bitwise reproducible run to run (atomic adds), so only the comparison says whether
the graph changes anything (tests/test_graphed_step.py compares them under deterministic algorithms).

    PYTHONPATH=. python3 benchmarks/claims_grid_speed.py --out benchmarks/results/claims_grid_speed_h200.json
    PYTHONPATH=. python3 benchmarks/claims_grid_speed.py --smoke --out /tmp/x.json  # CPU, tiny, eager only
    PYTHONPATH=. python3 benchmarks/claims_grid_speed.py --smoke --device cuda --out /tmp/x.json  # tiny, all modes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from andrea_exp.training.graphed_step import GraphedStep
from benchmarks.common import compose_cfg, git_commit, warmed_cell

D_KS = (64, 4096)
ASSUMED_TFLOPS = 790.0  # dense bf16 on an H200 SXM, a realistic fraction of the 989 peak


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, on the CPU eager only (for tests)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default cuda, with --smoke cpu (cuda: eager, graphed and eager again)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per mode (graph capture included)")
    parser.add_argument("--tflops", type=float, default=ASSUMED_TFLOPS, help="assumed bf16 rate for the bound")
    parser.add_argument("--out", type=Path, required=True, help="JSON result")
    args = parser.parse_args(argv)
    if args.device is None:
        args.device = "cpu" if args.smoke else "cuda"
    return args


def cell_overrides(d_k: int, smoke: bool, device: str | None = None) -> list[str]:
    """One claims-grid cell; smoke: tiny shapes, on the CPU unless `device` says otherwise."""
    base = ["logger.mode=disabled", "model=andrea_small", f"model.d_k={d_k}", "model.scale=true", "model.causal=true",
            "data.seq_len=128", "train.batch_size=32", "probe.every=0", "train.max_steps=1000"]
    if smoke:
        base += ["model.d_model=32", "model.n_layer=1", "model.block_size=16", "data.seq_len=16", "train.batch_size=4",
                 "data.train_sequences=64", "data.eval_sequences=8", f"train.device={device or 'cpu'}"]
    elif device is not None:
        base.append(f"train.device={device}")
    return base


def step_flops(cfg, params: int) -> float:
    m, tokens = cfg.model, cfg.train.batch_size * cfg.data.seq_len
    attention = 6 * m.n_layer * cfg.train.batch_size * m.n_head * cfg.data.seq_len ** 2 * (m.d_k + m.d_v)
    return 6.0 * params * tokens + attention


def time_mode(cfg, graphed: bool, warmup: int, steps: int) -> dict:
    """Seconds per step and the timed steps' losses of one fresh model in one mode."""
    cfg.train.cuda_graph = graphed
    cell, batches = warmed_cell(cfg, steps, warmup)
    if graphed and not isinstance(cell.step, GraphedStep):
        raise RuntimeError("train.cuda_graph=true did not give a graphed step")
    sync = torch.cuda.synchronize if cell.rt.device.type == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    losses = [cell.step(x, y)[0] for x, y in batches]
    sync()
    seconds = (time.perf_counter() - started) / steps
    return {"s_per_step": seconds, "losses": torch.stack(losses).float().tolist(), "graph_replayed": cell.graphed,
            "params": cell.model.num_params()}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.smoke:
        args.steps, args.warmup = min(args.steps, 4), min(args.warmup, 2)
    print(f"[claims-grid-speed] arithmetic bound at an assumed {args.tflops:g} TFLOP/s (bf16, dense)", flush=True)
    result = {"commit": git_commit(), "assumed_tflops": args.tflops, "smoke": args.smoke,
              "flops_formula": "6 * params * tokens + 6 * n_layer * batch * n_head * T^2 * (d_k + d_v)",
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "cells": {}}
    for d_k in D_KS:
        cfg = compose_cfg(cell_overrides(d_k, args.smoke, args.device))
        eager = time_mode(cfg, False, args.warmup, args.steps)
        on_gpu = args.device == "cuda"
        graphed = time_mode(cfg, True, args.warmup, args.steps) if on_gpu else None
        repeat = time_mode(cfg, False, args.warmup, args.steps) if on_gpu else None
        flops = step_flops(cfg, eager["params"])
        bound = flops / (args.tflops * 1e12)
        tokens = cfg.train.batch_size * cfg.data.seq_len
        cell = {"d_k": d_k, "params": eager["params"], "tokens_per_step": tokens, "flops_per_step": flops,
                "bound_ms": 1e3 * bound, "eager_ms": 1e3 * eager["s_per_step"],
                "eager_tokens_per_s": tokens / eager["s_per_step"]}
        line = (f"d_k {d_k}: {eager['params'] / 1e6:.2f}M params, {flops / 1e9:.1f} GFLOP/step, bound "
                f"{1e3 * bound:.3f} ms; eager {1e3 * eager['s_per_step']:.2f} ms")
        if graphed is not None:
            diff = max(abs(a - b) for a, b in zip(eager["losses"], graphed["losses"]))
            g_s = graphed["s_per_step"]
            cell.update({"graphed_ms": 1e3 * g_s, "graphed_tokens_per_s": tokens / g_s,
                         "graph_replayed": graphed["graph_replayed"], "speedup": eager["s_per_step"] / g_s,
                         "max_loss_diff": diff, "losses_bitwise_equal": eager["losses"] == graphed["losses"],
                         "eager_repeat_max_loss_diff": max(abs(a - b)
                                                           for a, b in zip(eager["losses"], repeat["losses"]))})
            line += (f", graphed {1e3 * g_s:.2f} ms (x{cell['speedup']:.1f}); max loss diff eager-graphed {diff:.2g}, "
                     f"eager-eager {cell['eager_repeat_max_loss_diff']:.2g}")
        print(f"[claims-grid-speed] {line}", flush=True)
        result["cells"][str(d_k)] = cell
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
