"""The Triton kernels behind attn_stats on CUDA: a stats-only fused attention pass.

Imported only on CUDA (step_stats imports it lazily), so CPU machines without Triton never load it.

Kernel 1 (`_row_block_stats`): one program per (batch, head, block of BLOCK_M query rows), flash-attention
style without the values: for each block of BLOCK_N keys, the raw dot products r = q k^T (tl.dot, float32
accumulation) and the online update of each row's running max m, sum l and a = sum exp(s - m) (s - m), all
in float32 and in base 2 (exp2, the scale pre-multiplied by log2 e; converted back to nats at the end).
The row's max m is kept on the raw r and each exponent formed as z = (r - m) c, c = scale log2 e > 0: the
key at the max then has z = 0 exactly and contributes exp2(0) = 1, so l >= 1 and max_prob = 1 / l <= 1
(entropy >= 0 too), whatever the compiler fuses. Forming s = r c first and z = s - max(s) does not give
that: the compiler contracts r c - max(s) into one fused multiply-add (Triton's default fp fusion), whose
unrounded product differs from the rounded one the max came from by up to half an ulp of s, so the max key
got exp2(+-ulp/2) instead of 1: at scores of 2048-4096 (log2 units) 1 -+ 8.5e-5, and saturated rows of a
120M run reported max_prob 1.00008 (1.00017 at scores above 4096).
Key blocks wholly visible to the block's rows run without a mask; the diagonal block (causal) or the last,
partial block run with it. At the row's end: entropy, entropy / log(visible keys), max probability 1 / l,
saturation, the row's largest logit; the block's rows are reduced to 6 partials (4 sums, 2 maxima).

Kernel 2 (`_finish_heads`): one program per head reduces its partials over batch and row blocks into the
(N_STATS, H) result in attn_stats.STATS order. Deterministic: no atomics.

Both read a (1,) int32 flag first and do nothing when it is 0 (a cadence inside a CUDA graph).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from andrea_exp.model.stat_rows import N_STATS, kept_rows

LOG2E = 1.4426950408889634
# per row block: sum entropy, sum entropy_norm, sum max_prob, max max_prob (rows with > 1 key), sum saturated, max logit
N_PARTIALS = 6  # written as the literal 6 inside the kernels: a jit function reads no global int


@triton.jit
def _online_update(m_i, l_i, a_i, r, visible, qk_scale, MASKED: tl.constexpr):
    """One key block folded into each row's (m, l, a). r: (BLOCK_M, BLOCK_N) raw dot products q.k; m_i the rows'
    running max of r; qk_scale = scale * log2 e > 0 turns differences of r into log2 units (l, a are in them).

    z = (r - m) * qk_scale: exactly 0 at the row's max (see the module docstring for why not r * qk_scale - m)."""
    if MASKED:
        m_block = tl.max(tl.where(visible, r, float("-inf")), 1)
    else:
        m_block = tl.max(r, 1)
    m_new = tl.maximum(m_i, m_block)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no visible key yet
    z = (r - m_safe[:, None]) * qk_scale  # finite: r is a raw dot product, masked or not; <= 0 where visible
    p = tl.math.exp2(z)
    if MASKED:
        p = tl.where(visible, p, 0.0)  # masked keys carry no mass
    alpha = tl.math.exp2((m_i - m_safe) * qk_scale)  # 0 while m_i is -inf, 1 while the max stays
    shift = tl.where(l_i > 0.0, (m_i - m_safe) * qk_scale, 0.0)  # 0 * -inf would be nan
    a_i = alpha * (a_i + l_i * shift) + tl.sum(p * z, 1)
    l_i = alpha * l_i + tl.sum(p, 1)
    return m_new, l_i, a_i, p, alpha  # p, alpha: for a pass that also weights the values (attn_fwd_stats_kernel)


@triton.jit
def _key_blocks(m_i, l_i, a_i, q, q_base, k_base, offs_m, start, stop, T, qk_scale,
                stride_qt, stride_qd, stride_kt, stride_kd,
                CAUSAL_MASK: tl.constexpr, MASKED: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ONE_D_BLOCK: tl.constexpr, IEEE: tl.constexpr):
    """Keys start..stop-1 in blocks of BLOCK_N folded into the rows offs_m."""
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(start, stop, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if ONE_D_BLOCK:  # q (BLOCK_M, BLOCK_D) was loaded once, outside the loop
            k = tl.load(k_base + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd,
                        mask=(offs_n[:, None] < T) & (offs_d[None, :] < HEAD_DIM), other=0.0)  # (BLOCK_N, BLOCK_D)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
        else:  # wide heads: the dot product accumulated over slices of BLOCK_D components
            s = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for d0 in range(0, HEAD_DIM, BLOCK_D):
                dd = d0 + offs_d
                qc = tl.load(q_base + offs_m[:, None] * stride_qt + dd[None, :] * stride_qd,
                             mask=(offs_m[:, None] < T) & (dd[None, :] < HEAD_DIM), other=0.0)
                kc = tl.load(k_base + offs_n[:, None] * stride_kt + dd[None, :] * stride_kd,
                             mask=(offs_n[:, None] < T) & (dd[None, :] < HEAD_DIM), other=0.0)
                if IEEE:
                    s = tl.dot(qc, tl.trans(kc), s, input_precision="ieee")
                else:
                    s = tl.dot(qc, tl.trans(kc), s)
        visible = _visible_in_block(offs_m, offs_n, T, CAUSAL_MASK)  # s: (BLOCK_M, BLOCK_N) raw q.k, unscaled
        m_i, l_i, a_i, _, _ = _online_update(m_i, l_i, a_i, s, visible, qk_scale, MASKED)
    return m_i, l_i, a_i


@triton.jit
def _visible_in_block(offs_m, offs_n, T, CAUSAL: tl.constexpr):
    """Which keys offs_n rows offs_m see (model.visibility.key_visible with t_q == t_k == T), keys past T none:
    (BLOCK_M, BLOCK_N) bool, (1, BLOCK_N) without the causal mask."""
    visible = offs_n[None, :] < T
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= offs_m[:, None])
    return visible


@triton.jit
def _visible_count(offs_m, T, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """(BLOCK_M,) int32: how many keys rows offs_m see (model.visibility.visible_count with t_q == t_k == T)."""
    if CAUSAL:
        n_visible = tl.minimum(offs_m + 1, T)
    else:
        n_visible = tl.zeros([BLOCK_M], dtype=tl.int32) + T
    return n_visible


@triton.jit
def _masked_key_range(block, T, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, hi): a row block's keys 0..lo-1 need no mask, lo..hi-1 do (causal: the diagonal block), later ones are
    not visited. Walked in blocks of BLOCK_N from 0 and from lo: causal, BLOCK_M must be a multiple of BLOCK_N
    (tests/test_visibility.py checks the walk against model.visibility's rule)."""
    if CAUSAL:
        lo = block * BLOCK_M  # keys before the block's first row: visible to all its rows
        hi = tl.minimum(lo + BLOCK_M, T)
    else:
        lo = (T // BLOCK_N) * BLOCK_N  # whole key blocks, then the partial one
        hi = T
    return lo, hi


@triton.jit
def _store_row_partials(out, m_i, l_i, a_i, offs_m, T, scale, threshold, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """A block of rows' (m, l, a) -> its N_PARTIALS partials at `out`: 4 sums, 2 maxima (see N_PARTIALS)."""
    ln2 = 0.6931471805599453
    row_ok = offs_m < T
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # padding rows only
    entropy = tl.log(l_safe) - ln2 * a_i / l_safe  # nats
    max_prob = 1.0 / l_safe
    n_visible = _visible_count(offs_m, T, CAUSAL, BLOCK_M)
    kept = row_ok & (n_visible > 1)
    entropy_norm = tl.where(kept, entropy / tl.log(tl.maximum(n_visible.to(tl.float32), 2.0)), 0.0)
    saturated = row_ok & (max_prob > threshold)
    logit = m_i * scale  # the row's largest score: its largest raw dot product, scaled as s = q.k * scale
    tl.store(out + 0, tl.sum(tl.where(row_ok, entropy, 0.0), 0))
    tl.store(out + 1, tl.sum(entropy_norm, 0))
    tl.store(out + 2, tl.sum(tl.where(row_ok, max_prob, 0.0), 0))
    tl.store(out + 3, tl.max(tl.where(kept, max_prob, 0.0), 0))
    tl.store(out + 4, tl.sum(saturated.to(tl.float32), 0))
    tl.store(out + 5, tl.max(tl.where(row_ok, logit, float("-inf")), 0))


@triton.jit
def _row_block_stats(q_ptr, k_ptr, part_ptr, flag_ptr,
                     stride_qb, stride_qh, stride_qt, stride_qd, stride_kb, stride_kh, stride_kt, stride_kd,
                     B, H, T, n_row_blocks, qk_scale, scale, threshold,
                     CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, ONE_D_BLOCK: tl.constexpr, IEEE: tl.constexpr):
    if tl.load(flag_ptr) != 0:
        pid = tl.program_id(0)
        block = n_row_blocks - 1 - pid % n_row_blocks  # the longest causal rows first
        bh = pid // n_row_blocks
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)
        q_base = q_ptr + b * stride_qb + h * stride_qh
        k_base = k_ptr + b * stride_kb + h * stride_kh
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        if ONE_D_BLOCK:
            offs_d = tl.arange(0, BLOCK_D)
            q = tl.load(q_base + offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd,
                        mask=(offs_m[:, None] < T) & (offs_d[None, :] < HEAD_DIM), other=0.0)  # (BLOCK_M, BLOCK_D)
        else:
            q = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # unused: q is loaded slice by slice in _key_blocks
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        a_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        lo, hi = _masked_key_range(block, T, CAUSAL, BLOCK_M, BLOCK_N)
        m_i, l_i, a_i = _key_blocks(m_i, l_i, a_i, q, q_base, k_base, offs_m, 0, lo, T, qk_scale,
                                    stride_qt, stride_qd, stride_kt, stride_kd, False, False, HEAD_DIM,
                                    BLOCK_M, BLOCK_N, BLOCK_D, ONE_D_BLOCK, IEEE)
        m_i, l_i, a_i = _key_blocks(m_i, l_i, a_i, q, q_base, k_base, offs_m, lo, hi, T, qk_scale,
                                    stride_qt, stride_qd, stride_kt, stride_kd, CAUSAL, True, HEAD_DIM,
                                    BLOCK_M, BLOCK_N, BLOCK_D, ONE_D_BLOCK, IEEE)

        _store_row_partials(part_ptr + ((h * B + b) * n_row_blocks + block) * 6, m_i, l_i, a_i, offs_m, T,
                            scale, threshold, CAUSAL, BLOCK_M)


@triton.jit
def _finish_heads(part_ptr, out_ptr, flag_ptr, R, H, inv_rows, inv_kept, BLOCK_R: tl.constexpr):
    """Head h's R = B * n_row_blocks partials -> out[:, h] (N_STATS, H), in attn_stats.STATS order."""
    if tl.load(flag_ptr) != 0:
        h = tl.program_id(0)
        offs = tl.arange(0, BLOCK_R)
        entropy = tl.zeros([BLOCK_R], dtype=tl.float32)
        entropy_norm = tl.zeros([BLOCK_R], dtype=tl.float32)
        max_prob = tl.zeros([BLOCK_R], dtype=tl.float32)
        max_prob_max = tl.zeros([BLOCK_R], dtype=tl.float32)
        saturated = tl.zeros([BLOCK_R], dtype=tl.float32)
        logit = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            r = r0 + offs
            ok = r < R
            base = part_ptr + (h.to(tl.int64) * R + r) * 6
            entropy += tl.load(base + 0, mask=ok, other=0.0)
            entropy_norm += tl.load(base + 1, mask=ok, other=0.0)
            max_prob += tl.load(base + 2, mask=ok, other=0.0)
            max_prob_max = tl.maximum(max_prob_max, tl.load(base + 3, mask=ok, other=0.0))
            saturated += tl.load(base + 4, mask=ok, other=0.0)
            logit = tl.maximum(logit, tl.load(base + 5, mask=ok, other=float("-inf")))
        tl.store(out_ptr + 0 * H + h, tl.max(logit, 0))
        tl.store(out_ptr + 1 * H + h, tl.sum(entropy, 0) * inv_rows)
        tl.store(out_ptr + 2 * H + h, tl.sum(entropy_norm, 0) * inv_kept)
        tl.store(out_ptr + 3 * H + h, tl.sum(max_prob, 0) * inv_rows)
        tl.store(out_ptr + 4 * H + h, tl.max(max_prob_max, 0))
        tl.store(out_ptr + 5 * H + h, tl.sum(saturated, 0) * inv_rows)


def launch_config(head_dim: int, dtype: torch.dtype) -> dict:
    """Block sizes, warps and stages for a head width and input dtype.

    bf16 / fp16: blocks of 64 query rows and 64 keys, one warp group, 3 stages, the q block in registers up to
    128 components and read in slices of 64 above: the fastest of 42 configurations (BLOCK_M 64-256, BLOCK_N
    32-128, 4 or 8 warps, 2-4 stages) at the 120M layer shape on an H200, for d_k 64 and 256 alike
    (benchmarks/investigations/attn_stats_kernel_configs.py). float32 inputs (IEEE dot products, no tensor
    cores) take smaller key blocks, slices of 32 above 64 components."""
    # (register use checked with ptxas for sm_90: none of these spills)
    padded = max(16, triton.next_power_of_2(head_dim))
    if dtype == torch.float32:
        one_block = head_dim <= 64
        return dict(BLOCK_M=64, BLOCK_N=32, BLOCK_D=padded if one_block else 32, ONE_D_BLOCK=one_block, num_warps=8,
                    num_stages=2)
    one_block = head_dim <= 128
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_D=padded if one_block else 64, ONE_D_BLOCK=one_block, num_warps=4,
                num_stages=3)


def head_stats_triton(q: torch.Tensor, k: torch.Tensor, enabled: torch.Tensor, scale: float, causal: bool,
                      threshold: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """q, k (B, H, T, d) on CUDA, any strides (an expanded k with stride 0 over heads included) ->
    (N_STATS, H) float32, written into `out` when given. Two kernel launches, no host sync, capturable in a
    CUDA graph. With enabled[0] == 0 nothing is written."""
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        q = q.float()
    k = k.to(q.dtype)
    B, H, T, D = q.shape
    if not scale > 0:  # the row's max is taken on q.k before scaling (see the module docstring)
        raise ValueError(f"scale must be positive; got {scale!r}")
    if k.shape != q.shape:
        raise ValueError(f"q and k must have the same shape; got {tuple(q.shape)} and {tuple(k.shape)}")
    cfg = launch_config(D, q.dtype)
    n_row_blocks = triton.cdiv(T, cfg["BLOCK_M"])
    partials = torch.empty((H, B, n_row_blocks, N_PARTIALS), dtype=torch.float32, device=q.device)
    _row_block_stats[(B * H * n_row_blocks,)](
        q, k, partials, enabled, *q.stride(), *k.stride(), B, H, T, n_row_blocks, float(scale) * LOG2E, float(scale),
        float(threshold), CAUSAL=bool(causal), HEAD_DIM=D, IEEE=q.dtype == torch.float32, **cfg)
    return finish_heads(partials, enabled, T, causal, out)


def finish_heads(partials: torch.Tensor, enabled: torch.Tensor, T: int, causal: bool,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """The row blocks' partials (H, B, n_row_blocks, N_PARTIALS) -> (N_STATS, H) float32: one launch, no host
    sync. With enabled[0] == 0 nothing is written."""
    H, B, n_row_blocks, _ = partials.shape
    if out is None:
        out = torch.empty((N_STATS, H), dtype=torch.float32, device=partials.device)
    n_kept = B * kept_rows(T, causal)
    _finish_heads[(H,)](partials, out, enabled, B * n_row_blocks, H, 1.0 / (B * T), 1.0 / n_kept if n_kept else 0.0,
                        BLOCK_R=min(1024, max(16, triton.next_power_of_2(B * n_row_blocks))), num_warps=4)
    if not n_kept:  # no row has more than one key (T == 1): entropy_norm, max_prob_max undefined, as in the probe
        out[2].masked_fill_(enabled.bool(), math.nan)  # on the device: no host sync on the flag
        out[4].masked_fill_(enabled.bool(), math.nan)
    return out
