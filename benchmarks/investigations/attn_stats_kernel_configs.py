"""Where the statistics kernel's time goes, and which launch configuration is fastest (GPU only).

At one ANDREA-120M layer's shape (B 32, H 12, T 1024, bf16, causal; q, k views of a (B, T, H, d) tensor as the
model's), for d_k 64 and 256:
- SDPA's forward at the same shape, the yardstick;
- the statistics pass (step_stats_kernel._row_block_stats) over a grid of BLOCK_M x BLOCK_N x warps x stages;
- with the best configurations, diagnostic variants of its inner update, built from the kernel's source with
  one function body replaced: `max_only` (the dot products and the row max: the floor of the loads and the
  matmul), `no_entropy` (max and sum, no sum p z), `exp_f16x2` (the full update with exp2 taken two at a time
  in half precision, ex2.approx.f16x2), each with its largest error against the explicit pipeline in float64.

    PYTHONPATH=. python3 benchmarks/investigations/attn_stats_kernel_configs.py --out /tmp/configs.json
    PYTHONPATH=. python3 benchmarks/investigations/attn_stats_kernel_configs.py --batch-size 2 --max-configs 2 \
        --head-dims 64 --out /tmp/configs.json                                  # seconds: checks the script
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import itertools
import json
import re
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
from torch.nn import functional as F
from triton.testing import do_bench

from andrea_exp.instruments import attn_stats
from andrea_exp.model import step_stats_kernel
from benchmarks.common import packed_qkv

UPDATE_HEAD = "def _online_update(m_i, l_i, a_i, r, visible, qk_scale, MASKED: tl.constexpr):"
VARIANT_BODIES = {
    "max_only": """
    if MASKED:
        m_block = tl.max(tl.where(visible, r, float("-inf")), 1)
    else:
        m_block = tl.max(r, 1)
    m_new = tl.maximum(m_i, m_block)
    l_i = l_i + 1.0
    return m_new, l_i, a_i, r, m_new
""",
    "no_entropy": """
    if MASKED:
        m_block = tl.max(tl.where(visible, r, float("-inf")), 1)
    else:
        m_block = tl.max(r, 1)
    m_new = tl.maximum(m_i, m_block)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.math.exp2((r - m_safe[:, None]) * qk_scale)
    if MASKED:
        p = tl.where(visible, p, 0.0)
    alpha = tl.math.exp2((m_i - m_safe) * qk_scale)
    l_i = alpha * l_i + tl.sum(p, 1)
    return m_new, l_i, a_i, p, alpha
""",
}
EXP_F16X2 = '''
@triton.jit
def _exp2_f16x2(z):
    """exp2 of float32 z, two at a time in half precision (ex2.approx.f16x2), back to float32."""
    half = z.to(tl.float16)
    p = tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [half], dtype=tl.float16, is_pure=True,
                                  pack=2)
    return p.to(tl.float32)

'''


def variant_module(name: str):
    """step_stats_kernel with _online_update's body replaced (or its exp2 swapped), as a fresh module."""
    source = inspect.getsource(step_stats_kernel)
    if name == "exp_f16x2":
        source = source.replace("    p = tl.math.exp2(z)\n", "    p = _exp2_f16x2(z)\n", 1)
        source = source.replace("@triton.jit\ndef _online_update", EXP_F16X2 + "@triton.jit\ndef _online_update", 1)
    elif name != "full":
        start = source.index(UPDATE_HEAD) + len(UPDATE_HEAD)
        end = source.index("\n", source.index("    return m_new, l_i, a_i", start)) + 1
        source = source[:start] + VARIANT_BODIES[name] + source[end:]
    path = Path(tempfile.mkdtemp()) / f"stats_kernel_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"stats_kernel_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def row_kernel_ms(module, q, k, cfg: dict) -> float:
    B, H, T, D = q.shape
    n_row_blocks = triton.cdiv(T, cfg["BLOCK_M"])
    partials = torch.empty((H, B, n_row_blocks, module.N_PARTIALS), dtype=torch.float32, device=q.device)
    flag = torch.ones(1, dtype=torch.int32, device=q.device)
    scale = D ** -0.5

    def launch():
        module._row_block_stats[(B * H * n_row_blocks,)](
            q, k, partials, flag, *q.stride(), *k.stride(), B, H, T, n_row_blocks, scale * module.LOG2E, scale,
            0.9, CAUSAL=True, HEAD_DIM=D, IEEE=False, **cfg)
    launch()
    return do_bench(launch, warmup=25, rep=100, return_mode="median")


def max_error(module, q, k, cfg: dict) -> dict:
    """The variant's (N_STATS, H) on two sequences against the explicit pipeline in float64."""
    original = module.launch_config
    module.launch_config = lambda head_dim, dtype: dict(cfg)
    try:
        got = module.head_stats_triton(q[:2], k[:2], torch.ones(1, dtype=torch.int32, device="cuda"),
                                       q.size(-1) ** -0.5, True, 0.9)
    finally:
        module.launch_config = original
    ref = attn_stats.reference_head_stats(q[:2].double(), k[:2].double(), scale=q.size(-1) ** -0.5, causal=True,
                                          threshold=0.9)
    return {name: ((g - r).abs() / (1 + r.abs())).max().item() for name, g, r in zip(attn_stats.STATS, got, ref)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--head-dims", default="64,256")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-configs", type=int, default=None, help="time only the grid's first N configurations")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    B = args.batch_size
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "shape": f"B {B}, H 12, T 1024, bf16, causal", "by_head_dim": {}}
    full = variant_module("full")
    for d in (int(x) for x in args.head_dims.split(",")):
        q, k, v = packed_qkv(B, 12, 1024, d, torch.Generator(device="cuda").manual_seed(0))
        entry = {"sdpa_forward_ms": do_bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                             warmup=25, rep=100, return_mode="median")}
        current = step_stats_kernel.launch_config(d, torch.bfloat16)
        entry["current_launch_config"] = {k_: v_ for k_, v_ in current.items()}
        one_block = d <= 128
        padded = max(16, triton.next_power_of_2(d))
        grid = []
        for bm, bn, w, st in itertools.product((64, 128, 256), (32, 64, 128), (4, 8), (2, 3, 4)):
            if bm * bn > 128 * 128 or (bm == 256 and w == 4) or (not one_block and bn > 64):
                continue
            if args.max_configs is not None and len(grid) >= args.max_configs:
                break
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=padded if one_block else 64, ONE_D_BLOCK=one_block,
                       num_warps=w, num_stages=st)
            try:
                ms = row_kernel_ms(full, q, k, cfg)
            except Exception as error:  # out of shared memory or registers: a configuration that does not exist
                print(f"d {d} {cfg}: {type(error).__name__}", flush=True)
                continue
            grid.append({**cfg, "ms": ms})
            print(f"d {d} BM {bm} BN {bn} w {w} st {st}: {ms:.4f} ms", flush=True)
        grid.sort(key=lambda row: row["ms"])
        entry["grid"] = grid
        best = {k_: v_ for k_, v_ in grid[0].items() if k_ != "ms"}
        entry["variants"] = {}
        for name in ("full", "max_only", "no_entropy", "exp_f16x2"):
            module = full if name == "full" else variant_module(name)
            try:
                entry["variants"][name] = {"ms": row_kernel_ms(module, q, k, best),
                                           "max_rel_err": max_error(module, q, k, best)}
            except Exception as error:
                entry["variants"][name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            print(f"d {d} variant {name}: {entry['variants'][name]}", flush=True)
        result["by_head_dim"][str(d)] = entry
        print(f"d {d}: SDPA forward {entry['sdpa_forward_ms']:.4f} ms; best {grid[0]}", flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    result["total_s"] = time.perf_counter() - started
    args.out.write_text(json.dumps(result, indent=1))
    print(re.sub(r"\s+", " ", f"done in {result['total_s']:.0f} s"), flush=True)
    return result


if __name__ == "__main__":
    main()
