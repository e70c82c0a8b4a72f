"""Which backward can follow the fused pass (attention and statistics in one Triton forward), and at what cost
(GPU only).

At one ANDREA-120M layer's shape (B 32, H 12, T 1024, d 64, bf16, causal): forward + backward of SDPA (PyTorch's
choice, flash forced, cuDNN forced) against the fused forward followed by PyTorch's flash backward or cuDNN's
backward on its output and log-sum-exp; each pair's gradients against the float64 formula on two sequences.

    PYTHONPATH=. python3 benchmarks/investigations/attn_fwd_stats_backward.py --out /tmp/backward.json
    PYTHONPATH=. python3 benchmarks/investigations/attn_fwd_stats_backward.py --batch-size 2 --out /tmp/backward.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from andrea_exp.model.attn_fwd_stats_kernel import attention_with_stats
from benchmarks.common import packed_qkv, timed

B, H, T, D = 32, 12, 1024, 64
SCALE = D ** -0.5


def cudnn_layout(q, k, v):
    """cuDNN's forward on these operands: its log-sum-exp (shape, strides) and random state, for its backward."""
    with torch.no_grad():
        res = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False, scale=SCALE)
    return res[1], res[6], res[7]


def fused_with(backward: str, lse_like: torch.Tensor | None, seed, offset):
    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            flag = torch.ones(1, dtype=torch.int32, device=q.device)
            out, lse, _ = attention_with_stats(q, k, v, flag, SCALE, True, 0.99)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            t = q.size(-2)
            if backward == "flash":
                unused = torch.zeros((), dtype=torch.int64)
                return torch.ops.aten._scaled_dot_product_flash_attention_backward(
                    grad_out, q, k, v, out, lse, None, None, t, t, 0.0, True, unused, unused, scale=SCALE)
            stats = lse.view(*lse.shape, 1) if lse_like.dim() == 4 else lse
            return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
                grad_out, q, k, v, out, stats, seed, offset, None, None, None, t, t, 0.0, True, scale=SCALE)

    return Fused.apply


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch-size", type=int, default=B, help="sequences timed (the gradients' check takes 2)")
    args = parser.parse_args(argv)
    batch = args.batch_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (t.requires_grad_() for t in packed_qkv(batch, H, T, D, gen))  # (B, H, T, D) views
    grad = torch.randn(batch, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [batch, H, T, D]}
    lse_c, seed, offset = cudnn_layout(q, k, v)
    flag = torch.ones(1, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        _, lse_f, _ = attention_with_stats(q, k, v, flag, SCALE, True, 0.99)
    result["cudnn_lse"] = {"shape": list(lse_c.shape), "stride": list(lse_c.stride()), "dtype": str(lse_c.dtype),
                           "max_abs_diff_vs_fused_lse": (lse_c.reshape(batch, H, T) - lse_f).abs().max().item(),
                           "seed": [list(seed.shape), str(seed.device)]}
    print(result, flush=True)

    def sdpa(backend):
        def run(q_, k_, v_):
            if backend is None:
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, scale=SCALE)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, scale=SCALE)
        return run

    passes = {"sdpa_auto": sdpa(None), "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
              "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "fused_flash_backward": fused_with("flash", None, 0, 0),
              "fused_cudnn_backward": fused_with("cudnn", lse_c, seed, offset)}
    sync = torch.cuda.synchronize
    result["ms"] = {}
    for name, fn in passes.items():
        try:
            fwd = 1e3 * timed(lambda: fn(q, k, v), 20, sync)
            both = 1e3 * timed(lambda: torch.autograd.grad(fn(q, k, v), (q, k, v), grad), 20, sync)
            result["ms"][name] = {"forward": fwd, "forward_backward": both, "backward": both - fwd}
        except Exception as error:
            result["ms"][name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        print(name, result["ms"][name], flush=True)
    two = [t[:2].detach().requires_grad_() for t in (q, k, v)]
    future = torch.ones(T, T, dtype=torch.bool, device="cuda").triu(1)
    exact = torch.softmax((two[0].double() @ two[1].double().transpose(-2, -1) * SCALE).masked_fill(future, -math.inf),
                          -1) @ two[2].double()
    exact_grads = torch.autograd.grad(exact, two, grad[:2].double())
    lse2, seed2, offset2 = cudnn_layout(*two)
    passes["fused_cudnn_backward"] = fused_with("cudnn", lse2, seed2, offset2)
    result["grad_max_abs_err_vs_float64"] = {}
    for name, fn in passes.items():
        try:
            grads = torch.autograd.grad(fn(*two), two, grad[:2])
            result["grad_max_abs_err_vs_float64"][name] = {
                t: (g.double() - r).abs().max().item() for t, g, r in zip("qkv", grads, exact_grads)}
        except Exception as error:
            result["grad_max_abs_err_vs_float64"][name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        print(name, result["grad_max_abs_err_vs_float64"][name], flush=True)
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
