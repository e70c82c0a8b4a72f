"""The fused forward with the statistics (attn_fwd_stats_kernel) over launch configurations, beside PyTorch's own
forwards at the same shape (GPU only).

At one ANDREA-120M layer's shape (B 32, H 12, T 1024, bf16, causal; q, k, v views of a (B, T, 3, H, d) tensor, as
the model's fused projection gives them): cuDNN's and flash's SDPA forward, the yardsticks; then
attention_with_stats over BLOCK_M x BLOCK_N x warps x stages (causal: BLOCK_M a multiple of BLOCK_N), each timed
alone (triton.testing.do_bench, median) with its largest error against SDPA's output and its log-sum-exp; the
fastest configurations' statistics against the explicit pipeline in float64 (attn_stats.reference_head_stats).
The kernel's LAUNCH is the configuration the model uses; a faster one that stays exact is the candidate.

    PYTHONPATH=. python3 benchmarks/investigations/attn_fwd_stats_configs.py --out /tmp/fwd_configs.json
    PYTHONPATH=. python3 benchmarks/investigations/attn_fwd_stats_configs.py --batch-size 2 --max-configs 2 \
        --out /tmp/fwd_configs.json                                             # seconds: checks the script
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch
import triton
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from andrea_exp.instruments import attn_stats
from andrea_exp.model import attn_fwd_stats_kernel as fused
from benchmarks.common import git_commit, packed_qkv, write_result

H, T = 12, 1024
CHECKED = 3  # the fastest configurations whose statistics are checked against float64


def sdpa_ms(q, k, v, backend) -> float | dict:
    try:
        with sdpa_kernel(backend):
            return do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), warmup=25, rep=100,
                            return_mode="median")
    except RuntimeError as error:  # a backend that does not take the shape here
        return {"error": f"{type(error).__name__}: {str(error)[:200]}"}


def configs(max_configs: int | None) -> list[dict]:
    grid = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st)
            for bm, bn, w, st in itertools.product((64, 128), (32, 64, 128), (4, 8), (2, 3, 4)) if bm % bn == 0]
    grid.sort(key=lambda c: c != fused.LAUNCH)  # the model's own first, so a short run still measures it
    return grid[:max_configs] if max_configs is not None else grid


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-configs", type=int, default=None, help="time only the grid's first N configurations")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    B, d = args.batch_size, args.head_dim
    scale = d ** -0.5
    q, k, v = packed_qkv(B, H, T, d, torch.Generator(device="cuda").manual_seed(0))
    flag = torch.ones(1, dtype=torch.int32, device="cuda")
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    reference = attn_stats.reference_head_stats(q[:2].double(), k[:2].double(), scale=scale, causal=True,
                                                threshold=0.99)
    result = {"command": "PYTHONPATH=. python3 benchmarks/investigations/attn_fwd_stats_configs.py "
                         + " ".join(argv if argv is not None else []),
              "commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "shape": f"B {B}, H {H}, T {T}, d {d}, bf16, causal",
              "model_launch": fused.LAUNCH,
              "sdpa_forward_ms": {name: sdpa_ms(q, k, v, backend) for name, backend in
                                  (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION))}}
    print(f"SDPA forward: {result['sdpa_forward_ms']}", flush=True)
    grid = []
    for cfg in configs(args.max_configs):
        try:
            out, _, _ = fused.attention_with_stats(q, k, v, flag, scale, True, 0.99, cfg)
            ms = do_bench(lambda cfg=cfg: fused.attention_with_stats(q, k, v, flag, scale, True, 0.99, cfg),
                          warmup=25, rep=100, return_mode="median")
        except Exception as error:  # out of shared memory or registers: a configuration that does not exist here
            print(f"{cfg}: {type(error).__name__}", flush=True)
            continue
        row = {**cfg, "ms": ms, "out_max_abs_err": (out.float() - expected).abs().max().item()}
        grid.append(row)
        print(f"BM {cfg['BLOCK_M']} BN {cfg['BLOCK_N']} w {cfg['num_warps']} st {cfg['num_stages']}: {ms:.4f} ms, "
              f"out err {row['out_max_abs_err']:.2e}", flush=True)
    grid.sort(key=lambda row: row["ms"])
    for row in grid[:CHECKED]:  # the candidates: their statistics against float64
        cfg = {key: row[key] for key in fused.LAUNCH}
        _, _, stats = fused.attention_with_stats(q[:2], k[:2], v[:2], flag, scale, True, 0.99, cfg)
        row["stats_max_rel_err"] = {name: ((g - r).abs() / (1 + r.abs())).max().item()
                                    for name, g, r in zip(attn_stats.STATS, stats, reference)}
    result["grid"] = grid
    model_row = next((row for row in grid if all(row[key] == fused.LAUNCH[key] for key in fused.LAUNCH)), None)
    result["model_launch_ms"] = model_row["ms"] if model_row else None
    result["best"] = grid[0] if grid else None
    result["total_s"] = time.perf_counter() - started
    write_result(args.out, result)
    print(f"model's launch {result['model_launch_ms']} ms; best {result['best']}; {result['total_s']:.0f} s",
          flush=True)
    return json.loads(json.dumps(result))


if __name__ == "__main__":
    main()
