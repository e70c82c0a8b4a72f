"""How much GPU time several claims-grid cells need when their steps overlap, against one after another.

Separate processes on one GPU time-slice it: their kernels never run at the same time, so a grid of
small cells costs about the sum of its cells' GPU time. Within one process, kernels on different CUDA
streams can run at once. This builds the cells' steps (CUDA-graphed, as train() builds them) in one
process and times `--steps` steps of every cell three ways:

- serial: every cell's steps one cell after another, one stream (what time-slicing amounts to);
- streams: step i of every cell issued in turn, each cell on its own stream;
- alone: each cell by itself (the sum of these is the serial figure, measured cell by cell).

    PYTHONPATH=. python3 benchmarks/investigations/concurrent_cells.py --d-k 64 64 64 64 --out /tmp/cc.json
    PYTHONPATH=. python3 benchmarks/investigations/concurrent_cells.py --smoke --out /tmp/cc.json   # CPU: shapes only
    PYTHONPATH=. python3 benchmarks/investigations/concurrent_cells.py --smoke --device cuda --out /tmp/cc.json
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import time
from pathlib import Path

import torch

from benchmarks.claims_grid_speed import cell_overrides
from benchmarks.common import compose_cfg, git_commit, warmed_cell


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, on the CPU (no streams: checks the script) unless --device cuda")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="with --smoke: default cpu")
    parser.add_argument("--d-k", type=int, nargs="+", default=[64, 64, 256, 256, 4096, 4096],
                        help="one cell per entry")
    parser.add_argument("--steps", type=int, default=100, help="timed steps per cell")
    parser.add_argument("--timeout", type=float, default=0,
                        help="seconds; past them print every thread's stack and exit (0: no limit)")
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args(argv)


class Cell:
    def __init__(self, d_k: int, smoke: bool, steps: int, index: int, device: str | None = None):
        overrides = cell_overrides(d_k, smoke, device) + [f"seed={index}"]
        if smoke:
            overrides += ["model.n_head=2", "model.d_v=4"]
        cell, self.batches = warmed_cell(compose_cfg(overrides), steps)
        self.step = cell.step
        self.stream = torch.cuda.Stream(cell.rt.device) if cell.rt.device.type == "cuda" else None

    def on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def run(self, i: int):
        x, y = self.batches[i]
        with self.on_stream():
            self.step(x, y)


def timed(fn, sync) -> float:
    sync()
    started = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - started


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.timeout > 0:  # a stuck GPU run says where it is stuck instead of using up its time silently
        faulthandler.dump_traceback_later(args.timeout, exit=True)
    if args.smoke:
        args.d_k, args.steps = [4, 8], 3
        args.device = args.device or "cpu"
    cells = []
    for i, d_k in enumerate(args.d_k):
        cells.append(Cell(d_k, args.smoke, args.steps, i, args.device))
        print(f"[concurrent-cells] built cell {i} (d_k {d_k}): warm-up and capture done", flush=True)
    cuda = torch.cuda.is_available() and args.device != "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # every mode replays the same timed batches; the models go on training (the figures are times only)
    alone = [timed(lambda c=c: [c.run(i) for i in range(args.steps)], sync) for c in cells]
    print(f"[concurrent-cells] alone: {[round(t, 3) for t in alone]} s", flush=True)
    serial = timed(lambda: [c.run(i) for c in cells for i in range(args.steps)], sync)
    streams = timed(lambda: [c.run(i) for i in range(args.steps) for c in cells], sync)
    result = {
        "commit": git_commit(), "gpu": torch.cuda.get_device_name() if cuda else "cpu", "d_k": args.d_k,
        "steps": args.steps,
        "alone_ms_per_step": [round(1e3 * t / args.steps, 3) for t in alone],
        "serial_s": round(serial, 4), "streams_s": round(streams, 4),
        "speedup": round(serial / streams, 3) if streams > 0 else None,
    }
    print(f"[concurrent-cells] d_k {args.d_k}: alone {result['alone_ms_per_step']} ms/step; "
          f"{args.steps} steps of every cell: serial {serial:.3f} s, on streams {streams:.3f} s "
          f"({result['speedup']}x)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    faulthandler.cancel_dump_traceback_later()  # main() may be called from a longer-lived process
    return result


if __name__ == "__main__":
    main()
