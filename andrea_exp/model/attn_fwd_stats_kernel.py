"""Attention's forward and the statistics in one pass: the Triton kernel behind the fused path with train.attn_stats.

A flash-attention forward (one program per (batch, head, block of BLOCK_M query rows); for each block of keys the
scores, the online softmax and the weighted sum of the values, never the (T, T) matrix) whose online update is
the statistics pass's own (step_stats_kernel._online_update: running max m, sum l and a = sum p z in float32,
base 2), so the statistics cost one fused multiply-add per score instead of a second pass over q k^T. It writes
the output (B, T, H, d) as SDPA's flash kernel lays it out, the rows' log-sum-exp (B, H, T) float32 in natural
units of the scaled scores (what that kernel's backward reads), and, when the flag is on, the row blocks'
statistics partials (step_stats_kernel.finish_heads reduces them). The backward is PyTorch's cuDNN or flash
attention backward on (q, k, v, out, lse), both of which read that log-sum-exp (model.step_stats registers it).

Imported only on CUDA (step_stats imports it lazily).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from andrea_exp.model.stat_rows import N_STATS, STATS_PASS_MAX_HEAD_DIM, fused_pass_supports
from andrea_exp.model.step_stats_kernel import (
    LOG2E,
    N_PARTIALS,
    _masked_key_range,
    _online_update,
    _store_row_partials,
    _visible_in_block,
    finish_heads,
)

# one warp group, blocks of 64 rows and 64 keys, 3 stages: the statistics pass's configuration (launch_config);
# benchmarks/investigations/attn_fwd_stats_configs.py times this pass over other launch configurations
LAUNCH = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)


@triton.jit
def _weighted_key_blocks(acc, m_i, l_i, a_i, q, k_base, v_base, offs_m, start, stop, T, qk_scale,
                         stride_kt, stride_kd, stride_vt, stride_vd,
                         CAUSAL_MASK: tl.constexpr, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Keys start..stop-1 in blocks of BLOCK_N folded into the rows offs_m: (m, l, a) and acc = sum p v."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < T) & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=kv_mask,
                    other=0.0)  # (BLOCK_N, BLOCK_D)
        r = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) raw dot products, float32
        visible = _visible_in_block(offs_m, offs_n, T, CAUSAL_MASK)
        m_i, l_i, a_i, p, alpha = _online_update(m_i, l_i, a_i, r, visible, qk_scale, MASKED)
        v = tl.load(v_base + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=kv_mask,
                    other=0.0)  # (BLOCK_N, BLOCK_D)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)  # (BLOCK_M, BLOCK_D)
    return acc, m_i, l_i, a_i


@triton.jit
def _attn_fwd_stats(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, part_ptr, flag_ptr,
                    stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kt, stride_kd,
                    stride_vb, stride_vh, stride_vt, stride_vd, stride_ob, stride_oh, stride_ot, stride_od,
                    B, H, T, n_row_blocks, qk_scale, scale, threshold,
                    CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    block = n_row_blocks - 1 - pid % n_row_blocks  # the longest causal rows first
    bh = pid // n_row_blocks
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_mask = (offs_m[:, None] < T) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                mask=row_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
    k_base = k_ptr + b * stride_kb + h * stride_kh
    v_base = v_ptr + b * stride_vb + h * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    a_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, hi = _masked_key_range(block, T, CAUSAL, BLOCK_M, BLOCK_N)
    acc, m_i, l_i, a_i = _weighted_key_blocks(acc, m_i, l_i, a_i, q, k_base, v_base, offs_m, 0, lo, T, qk_scale,
                                              stride_kt, stride_kd, stride_vt, stride_vd, False, False, HEAD_DIM,
                                              BLOCK_N, BLOCK_D)
    acc, m_i, l_i, a_i = _weighted_key_blocks(acc, m_i, l_i, a_i, q, k_base, v_base, offs_m, lo, hi, T, qk_scale,
                                              stride_kt, stride_kd, stride_vt, stride_vd, CAUSAL, True, HEAD_DIM,
                                              BLOCK_N, BLOCK_D)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # padding rows only
    out = acc / l_safe[:, None]  # (BLOCK_M, BLOCK_D): softmax(scores) v
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :] * stride_od,
             out.to(o_ptr.dtype.element_ty), mask=row_mask)
    # log sum exp(s) = m scale + ln l: l sums 2^((r - m) qk_scale) = e^((r - m) scale)
    tl.store(lse_ptr + (b * H + h) * T + offs_m, m_i * scale + tl.log(l_safe), mask=offs_m < T)
    if tl.load(flag_ptr) != 0:
        _store_row_partials(part_ptr + ((h * B + b) * n_row_blocks + block) * 6, m_i, l_i, a_i, offs_m, T,
                            scale, threshold, CAUSAL, BLOCK_M)


def attention_with_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enabled: torch.Tensor, scale: float,
                         causal: bool, threshold: float,
                         launch: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, T, d) on CUDA (see stat_rows.fused_pass_supports) -> (out (B, H, T, d) laid out
    (B, T, H, d), lse (B, H, T) float32, statistics (N_STATS, H) float32, undefined unless enabled[0] != 0).
    Two launches, no host sync. launch: BLOCK_M, BLOCK_N, num_warps, num_stages (default LAUNCH); causal, BLOCK_M
    must be a multiple of BLOCK_N (the key-block walk, _masked_key_range)."""
    if not fused_pass_supports(q, k, v):
        raise ValueError(f"attention_with_stats takes bf16 / fp16 CUDA q, k, v of one shape, "
                         f"d <= {STATS_PASS_MAX_HEAD_DIM} and a multiple of 8; "
                         f"got {q.dtype} {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not scale > 0:  # the row's max is taken on q.k before scaling (see step_stats_kernel's docstring)
        raise ValueError(f"scale must be positive; got {scale!r}")
    launch = {**LAUNCH, **(launch or {})}
    if causal and launch["BLOCK_M"] % launch["BLOCK_N"]:
        raise ValueError(f"causal: BLOCK_M must be a multiple of BLOCK_N; got {launch['BLOCK_M']}, {launch['BLOCK_N']}")
    B, H, T, D = q.shape
    n_row_blocks = triton.cdiv(T, launch["BLOCK_M"])
    out = torch.empty((B, T, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)  # (B, H, T, D)
    lse = torch.empty((B, H, T), dtype=torch.float32, device=q.device)
    partials = torch.empty((H, B, n_row_blocks, N_PARTIALS), dtype=torch.float32, device=q.device)
    _attn_fwd_stats[(B * H * n_row_blocks,)](
        q, k, v, out, lse, partials, enabled, *q.stride(), *k.stride(), *v.stride(), *out.stride(), B, H, T,
        n_row_blocks, float(scale) * LOG2E, float(scale), float(threshold), CAUSAL=bool(causal), HEAD_DIM=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)), **launch)
    stats = finish_heads(partials, enabled, T, causal,
                         torch.empty((N_STATS, H), dtype=torch.float32, device=q.device))
    return out, lse, stats
