"""Where a sweep worker's start-up goes when many start at once: imports, the CUDA context, data and model.

Starts `--workers` Python processes at the same moment (as a local sweep's launcher does) and has each
time-stamp the steps a claims-grid cell takes before its first training step: the interpreter, `import
torch`, the training loop (`andrea_exp.training.loop`, which brings torch._dynamo), the probe (matplotlib), the
CUDA context, the cell's data and model on the device. Prints, per step, the median and slowest time
since the common start, and the median duration. Under MPS, start a daemon first and export its variables
(`eval "$(python3 -m andrea_exp.launch.mps start --cells-per-gpu 16)"`).

    PYTHONPATH=. python3 benchmarks/investigations/worker_startup.py --workers 12 --out /tmp/startup.json
    PYTHONPATH=. python3 benchmarks/investigations/worker_startup.py --workers 2 --smoke --out /tmp/startup.json   # CPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import git_commit, write_result

REPO = Path(__file__).resolve().parents[2]
STEPS = ("interpreter", "torch", "train_loop", "probe", "cuda_context", "data", "model")


def child(started: float, smoke: bool) -> None:
    """One worker: the seconds since `started` at which each of STEPS ended, as one JSON line."""
    marks = {"interpreter": time.time() - started}
    import torch
    marks["torch"] = time.time() - started
    import andrea_exp.training.loop  # noqa: F401 (what a worker loads before its first cell)
    marks["train_loop"] = time.time() - started
    import andrea_exp.instruments.probe  # noqa: F401 (matplotlib, as a cell's first map needs it)
    marks["probe"] = time.time() - started
    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    torch.empty(1, device=device)
    marks["cuda_context"] = time.time() - started
    from andrea_exp.data.sources import build_dataset
    from benchmarks.common import compose_cfg
    overrides = ["experiment=claims_grid", "seed=0"] + (["model=andrea_tiny", "data.seq_len=32"] if smoke else [])
    cfg = compose_cfg(overrides)
    data = build_dataset(cfg.data, cfg.data.seq_len, 0).to(device)
    marks["data"] = time.time() - started
    from andrea_exp.training.cell import build_model  # loaded with the loop above

    build_model(cfg, data.vocab_size).to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    marks["model"] = time.time() - started
    print(json.dumps(marks), flush=True)


def summarise(workers: list[dict]) -> dict:
    """Per step: median and slowest end (seconds since the common start) and median duration."""
    out = {}
    for i, step in enumerate(STEPS):
        ends = [w[step] for w in workers]
        durations = [w[step] - (w[STEPS[i - 1]] if i else 0.0) for w in workers]
        out[step] = {"end_median_s": round(statistics.median(ends), 3), "end_max_s": round(max(ends), 3),
                     "duration_median_s": round(statistics.median(durations), 3)}
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--smoke", action="store_true", help="CPU, a tiny model (checks the script)")
    parser.add_argument("--child", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child, args.smoke)
        return {}
    started = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.investigations.worker_startup", "--child",
                               repr(started), *(["--smoke"] if args.smoke else [])],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
             for _ in range(args.workers)]
    workers = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    result = {"commit": git_commit(), "workers": args.workers, "smoke": args.smoke,
              "command": "PYTHONPATH=. python3 benchmarks/investigations/worker_startup.py "
                         + " ".join(argv or sys.argv[1:]),
              "steps": summarise(workers), "per_worker": workers}
    print(json.dumps(result["steps"], indent=1), flush=True)
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
