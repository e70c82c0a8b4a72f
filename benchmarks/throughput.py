"""ANDREA-120M training throughput (tokens/s, ms a step, MFU, peak memory) through the real train loop,
with probes at the default cadence and with probes off; and andrea_small's step time against d_k.

    PYTHONPATH=. python3 benchmarks/throughput.py --out benchmarks/results/throughput_h200.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from andrea_exp.train import train
from benchmarks.common import compose_cfg, git_commit, steady_throughput

PEAK_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def flops_per_token(n_params_non_embedding: int, n_layer: int, d_model: int, seq_len: int, d_k: int, d_v: int,
                    n_head: int, vocab: int) -> float:
    """Training FLOPs a token (forward + backward = 3x forward): 6 N for the weight matmuls (the tied head
    counts as one) plus attention's two T x T products, q.k^T (2 T d_k a head) and p.v (2 T d_v a head),
    as in the PaLM appendix; the causal half is not subtracted, like the reference's count."""
    matmul = 6 * (n_params_non_embedding + vocab * d_model)
    attention = 6 * n_layer * seq_len * n_head * (d_k + d_v)
    return matmul + attention


def run_once(overrides: list[str], skip_steps: int) -> dict:
    cfg = compose_cfg(overrides)
    with tempfile.TemporaryDirectory() as tmp:
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        summary = train(cfg, Path(tmp))
        wall = time.perf_counter() - t0
        figures = steady_throughput(Path(tmp), skip_steps)
    figures["peak_mem_gb"] = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None
    figures["status"] = summary["run/status"]
    figures["wall_s"] = wall
    figures["params"] = summary["model/params"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="andrea_120m")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--steps", type=int, default=300, help="steps per run, warm-up included")
    parser.add_argument("--warmup", type=int, default=100, help="steps left out of the timing (compilation)")
    parser.add_argument("--probe-every", type=int, default=100, help="the default probe cadence")
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--peak-flops", type=float, default=None, help="bf16 peak; default by GPU name (989e12)")
    parser.add_argument("--dk-curve", default="64,128,256,512,1024,2048,4096",
                        help="d_k values for andrea_small's step time ('' to skip)")
    parser.add_argument("--dk-steps", type=int, default=40)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = args.peak_flops or next((v for k, v in PEAK_BF16.items() if k in gpu), 989e12)
    common = [f"model={args.model}", f"data.vocab_size={args.vocab}", "data.order=1", "data.branching=4",
              f"data.seq_len={args.seq_len}", f"model.block_size={max(args.seq_len, 64)}",
              f"data.train_sequences={max(4 * args.batch_size, 2048)}", "data.eval_sequences=16",
              f"train.batch_size={args.batch_size}", f"train.max_steps={args.steps}", "train.eval_every=0",
              "train.sample_tokens=0", "train.warmup_steps=10", f"train.compile={not args.no_compile}",
              "train.log_every=10", "probe.maps_every=0", "probe.batch_size=4", "logger.mode=disabled",
              f"train.device={args.device}", "train.progress=false"]
    cfg = compose_cfg(common)
    results = {"gpu": gpu, "model": args.model, "n_layer": cfg.model.n_layer, "d_model": cfg.model.d_model,
               "n_head": cfg.model.n_head, "d_k": cfg.model.d_k, "seq_len": args.seq_len, "vocab_size": args.vocab,
               "batch_size": args.batch_size, "compile": not args.no_compile, "steps": args.steps,
               "warmup_steps_excluded": args.warmup, "peak_flops": peak, "torch": torch.__version__,
               "commit": git_commit()}
    runs = {}
    for label, every in (("probes_on", args.probe_every), ("probes_off", 0)):
        runs[label] = run_once(common + [f"probe.every={every}"], args.warmup)
        n_non_emb = runs[label]["params"] - cfg.model.block_size * cfg.model.d_model - args.vocab * cfg.model.d_model
        fpt = flops_per_token(n_non_emb, cfg.model.n_layer, cfg.model.d_model, args.seq_len, cfg.model.d_k,
                              cfg.model.d_v, cfg.model.n_head, args.vocab)
        runs[label]["ms_per_step"] = 1e3 * args.batch_size * args.seq_len / runs[label]["tokens_per_s"]
        runs[label]["mfu"] = runs[label]["tokens_per_s"] * fpt / peak
        runs[label]["flops_per_token"] = fpt
        print(f"{label:10s} {runs[label]['tokens_per_s']:>12,.0f} tokens/s  {runs[label]['ms_per_step']:7.1f} ms/step  "
              f"MFU {100 * runs[label]['mfu']:5.1f}%  peak mem {runs[label]['peak_mem_gb'] or 0:.1f} GB", flush=True)
    results.update({"tokens_per_s": runs["probes_on"]["tokens_per_s"], "mfu": runs["probes_on"]["mfu"],
                    "probes": True, "probe_every": args.probe_every, "runs": runs})

    curve = []
    for d_k in [int(v) for v in args.dk_curve.split(",") if v]:
        for scale in ("true", "false"):
            small = ["model=andrea_small", f"model.d_k={d_k}", f"model.scale={scale}", "data.seq_len=256",
                     f"train.max_steps={args.dk_steps}", "train.eval_every=0", "train.sample_tokens=0",
                     "probe.every=0", "logger.mode=disabled", "train.batch_size=64", f"train.device={args.device}",
                     "train.progress=false", "train.compile=false", "data.train_sequences=4096",
                     "data.eval_sequences=16"]
            figures = run_once(small, skip_steps=10)
            point = {"d_k": d_k, "scale": scale == "true", "ms_per_step": 1e3 * 64 * 256 / figures["tokens_per_s"],
                     "tokens_per_s": figures["tokens_per_s"], "status": figures["status"]}
            curve.append(point)
            print(f"andrea_small d_k={d_k:5d} scale={scale:5s} {point['ms_per_step']:7.2f} ms/step", flush=True)
    results["dk_curve"] = {"model": "andrea_small", "batch_size": 64, "seq_len": 256, "compile": False, "points": curve}
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
