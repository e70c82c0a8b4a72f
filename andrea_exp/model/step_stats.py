"""The training batch's attention statistics, computed inside the attention's own forward (the model's side of
instruments/attn_stats, which describes them): `enable` gives each layer its `LayerStats`, which Attention.forward
calls once; `head_stats` the computation (PyTorch here, Triton in step_stats_kernel on CUDA).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from andrea_exp.model.stat_rows import (  # noqa: F401  (STATS, STATS_PASS_MAX_HEAD_DIM re-exported)
    HALF,
    N_STATS,
    STATS,
    STATS_PASS_MAX_HEAD_DIM,
    fused_pass_widths,
    kept_rows,
)
from andrea_exp.model.visibility import key_visible, visible_count
from andrea_exp.runs.metric_keys import SATURATION

KEY_CHUNK = 256  # keys per block on the PyTorch path


# ---------------------------------------------------------------- the PyTorch path


def row_softmax_stats(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool, key_chunk: int = KEY_CHUNK):
    """q, k (B, H, T, d) -> each row's max m, sum l = sum exp(s - m) and a = sum exp(s - m) (s - m) over its visible
    keys, (B, H, T) float32 each.

    Online over blocks of `key_chunk` keys: only (B, H, T, key_chunk) scores exist at a time.
    """
    q, k = q.detach().float(), k.detach().float()
    B, H, T, _ = q.shape
    m = q.new_full((B, H, T), -math.inf)
    total, a = q.new_zeros((B, H, T)), q.new_zeros((B, H, T))
    rows = torch.arange(T, device=q.device)[:, None]  # (T, 1)
    for start in range(0, T, key_chunk):
        keys = k[:, :, start:start + key_chunk]  # (B, H, C, d)
        s = (q @ keys.transpose(-2, -1)) * scale  # (B, H, T, C)
        visible = key_visible(rows, torch.arange(start, start + keys.size(2), device=q.device), T, T, causal)  # (T, C)
        m_new = torch.maximum(m, torch.where(visible, s, -math.inf).amax(-1))
        m_safe = torch.where(m_new == -math.inf, 0.0, m_new)  # a row with no visible key yet
        z = s - m_safe[..., None]  # (B, H, T, C), finite
        p = torch.where(visible, torch.exp(z), 0.0)
        alpha = torch.exp(m - m_safe)
        shift = torch.where(total > 0, m - m_safe, 0.0)  # 0 * -inf would be nan
        a = alpha * (a + total * shift) + (p * z).sum(-1)
        total = alpha * total + p.sum(-1)
        m = m_new
    return m, total, a


def head_stats_from_rows(m, total, a, causal: bool, threshold: float = SATURATION) -> torch.Tensor:
    """Each row's running max m, sum `total` (l) and a, (B, H, T) -> (N_STATS, H) in STATS order (see the
    module docstring)."""
    B, H, T = m.shape
    entropy = total.log() - a / total  # (B, H, T)
    max_prob = 1.0 / total
    n_vis = visible_count(T, T, causal, m.device)  # (T,)
    kept = (n_vis > 1).expand_as(entropy)
    n_kept = B * kept_rows(T, causal)  # from the shapes: no host sync
    norm = torch.where(kept, entropy / n_vis.float().log().clamp_min(1e-30), 0.0).sum((0, 2))  # (H,)
    undefined = torch.full_like(norm, math.nan)  # no row with two keys (T == 1)
    return torch.stack([
        m.amax((0, 2)),
        entropy.mean((0, 2)),
        norm / n_kept if n_kept else undefined,
        max_prob.mean((0, 2)),
        torch.where(kept, max_prob, 0.0).amax((0, 2)) if n_kept else undefined,
        (max_prob > threshold).float().mean((0, 2)),
    ])


def head_stats_torch(q, k, scale: float, causal: bool, threshold: float = SATURATION,
                     key_chunk: int = KEY_CHUNK) -> torch.Tensor:
    """The PyTorch path: q, k (B, H, T, d) -> (N_STATS, H) float32 (float32 q k^T even under autocast)."""
    with torch.autocast(q.device.type, enabled=False):
        return head_stats_from_rows(*row_softmax_stats(q, k, scale, causal, key_chunk), causal, threshold)


# ---------------------------------------------------------------- the op, either path


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@torch.library.custom_op("andrea_exp::attn_head_stats", mutates_args=())
def _attn_head_stats(q: torch.Tensor, k: torch.Tensor, enabled: torch.Tensor, scale: float, causal: bool,
                     threshold: float) -> torch.Tensor:
    """(N_STATS, H) float32 from q, k (B, H, T, d). On CUDA with Triton the kernels skip their work when
    enabled[0] == 0 (the result is then undefined); the PyTorch path always computes."""
    if q.is_cuda and triton_available():
        from andrea_exp.model.step_stats_kernel import head_stats_triton

        return head_stats_triton(q, k, enabled, scale, causal, threshold)
    return head_stats_torch(q, k, scale, causal, threshold)


@_attn_head_stats.register_fake
def _(q, k, enabled, scale, causal, threshold):
    return q.new_empty((N_STATS, q.size(1)), dtype=torch.float32)


def head_stats(q: torch.Tensor, k: torch.Tensor, *, scale: float, causal: bool, threshold: float = SATURATION,
               impl: str = "auto", enabled: torch.Tensor | None = None) -> torch.Tensor:
    """Attention statistics per head of q, k (B, H, T, d): (N_STATS, H) float32, rows in STATS order.

    scale multiplies q.k (attention.scale_factor); causal: key j visible to query i only when j <= i.
    impl: auto (Triton on CUDA when present, else PyTorch), torch, triton. Off the autograd graph.
    """
    q, k = q.detach(), k.detach()
    if impl == "torch":
        return head_stats_torch(q, k, scale, causal, threshold)
    if impl == "triton":
        from andrea_exp.model.step_stats_kernel import head_stats_triton

        on = enabled if enabled is not None else torch.ones(1, dtype=torch.int32, device=q.device)
        return head_stats_triton(q, k, on, scale, causal, threshold)
    if impl != "auto":
        raise ValueError(f"impl must be one of auto, torch, triton; got {impl!r}")
    on = enabled if enabled is not None else torch.ones(1, dtype=torch.int32, device=q.device)
    return torch.ops.andrea_exp.attn_head_stats(q, k, on, float(scale), bool(causal), float(threshold))


# ---------------------------------------------------------------- the attention and its statistics in one pass


@torch.library.custom_op("andrea_exp::attn_fwd_stats", mutates_args=())
def _attn_fwd_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, enabled: torch.Tensor, scale: float,
                    causal: bool, threshold: float, cudnn_backward: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    """(out (B, H, T, d), lse (B, H, T), statistics (N_STATS, H)) from q, k, v (B, H, T, d): attn_fwd_stats_kernel.
    cudnn_backward: gradients from cuDNN's attention backward, else from flash's (cudnn_backward_fits)."""
    from andrea_exp.model.attn_fwd_stats_kernel import attention_with_stats

    return attention_with_stats(q, k, v, enabled, scale, causal, threshold)


@_attn_fwd_stats.register_fake
def _(q, k, v, enabled, scale, causal, threshold, cudnn_backward):
    B, H, T, D = q.shape
    out = q.new_empty((B, T, H, D)).transpose(1, 2)  # (B, H, T, D), laid out as the kernel writes it
    return out, q.new_empty((B, H, T), dtype=torch.float32), q.new_empty((N_STATS, H), dtype=torch.float32)


def _save_for_backward(ctx, inputs, output):
    q, k, v, _, scale, causal, _, cudnn_backward = inputs
    out, lse, _ = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.scale, ctx.causal, ctx.cudnn_backward = scale, causal, cudnn_backward


def _attn_fwd_stats_backward(ctx, grad_out, _grad_lse, _grad_stats):
    """PyTorch's cuDNN or flash attention backward on the forward's out and log-sum-exp: both read the same
    natural-log log-sum-exp of the scaled scores (cuDNN's as (B, H, T, 1)). No dropout: the random state is never
    read; no sequence offsets, no bias: None, the dense batch."""
    q, k, v, out, lse = ctx.saved_tensors
    T = q.size(-2)
    if ctx.cudnn_backward:
        unused = torch.zeros((), dtype=torch.int64, device=q.device)
        grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, k, v, out, lse.unsqueeze(-1), unused, unused, None, None, None, T, T, 0.0, ctx.causal,
            scale=ctx.scale)
    else:
        unused = torch.zeros((), dtype=torch.int64)
        grads = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, None, None, T, T, 0.0, ctx.causal, unused, unused, scale=ctx.scale)
    return *grads, None, None, None, None, None


_attn_fwd_stats.register_autograd(_attn_fwd_stats_backward, setup_context=_save_for_backward)


def cudnn_backward_fits(sdpa_backend: str, device: torch.device) -> bool:
    """cuDNN's backward after the fused pass where SDPA itself runs cuDNN's kernels: model.sdpa_backend auto or
    cudnn, cuDNN attention on, a Hopper or newer GPU (and T a multiple of 64, checked per call); flash's
    elsewhere. On an H200 at the 120M layer shape cuDNN's backward takes 0.53 ms and flash's 0.71
    (benchmarks/investigations/attn_fwd_stats_backward.py). Decided in `enable`, outside compiled code."""
    return (device.type == "cuda" and sdpa_backend in ("auto", "cudnn") and torch.backends.cuda.cudnn_sdp_enabled()
            and torch.cuda.get_device_capability(device) >= (9, 0))


def autocast_operands(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in the dtype autocast gives the attention kernels, when autocast is on (else unchanged)."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) for t in tensors)


# ---------------------------------------------------------------- in the model


class LayerStats(nn.Module):
    """One attention layer's statistics of the training batch, made by `enable`: `values` (N_STATS, H) float32, which
    each training forward overwrites, and `flag` (1,) int32, shared by the layers, which turns the kernels on.

    fused_pass: this layer's training forward computes its attention and the statistics in one pass (the fused
    path on CUDA with Triton, PyTorch's choice of kernel, cuDNN or flash (the pass's backward is one of theirs),
    no score transforms, head widths the kernel takes); else a second pass reads q and k and the attention is left
    to the layer. cudnn_backward: that pass's gradients from cuDNN (cudnn_backward_fits), else from flash."""

    def __init__(self, n_head: int, scale: float, flag: torch.Tensor, fused_pass: bool, cudnn_backward: bool):
        super().__init__()
        self.scale, self.fused_pass, self.cudnn_backward = float(scale), fused_pass, cudnn_backward
        self.register_buffer("values", torch.full((N_STATS, n_head), math.nan, device=flag.device), persistent=False)
        self.register_buffer("flag", flag, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor | None:
        """q, k, v (B, H, T, .) as the attention uses them, mask (attention.Mask) -> self.values; the attention's
        output (B, H, T, d_v) when the fused pass computed it with them, else None (the layer attends).

        Only in a training forward: train mode, gradients on, every key present (mask.visible_keys None)."""
        if not self.training or not torch.is_grad_enabled() or mask.visible_keys is not None:
            return None
        q, k = autocast_operands(q, k)  # the attention kernels see q, k (and v) in the autocast dtype
        if self.fused_pass and q.dtype in HALF:  # a float32 forward (no autocast) takes the separate pass
            (v,) = autocast_operands(v)
            cudnn = self.cudnn_backward and q.size(-2) % 64 == 0  # cuDNN's backward takes T a multiple of 64
            out, _, stats = torch.ops.andrea_exp.attn_fwd_stats(q, k, v, self.flag, self.scale, bool(mask.causal),
                                                                SATURATION, cudnn)
            self.values.copy_(stats.detach())  # a buffer, never part of the autograd graph
            return out
        stats = torch.ops.andrea_exp.attn_head_stats(q.detach(), k.detach().to(q.dtype), self.flag, self.scale,
                                                     bool(mask.causal), SATURATION)
        self.values.copy_(stats)
        return None


def fused_pass_takes(attn, device: torch.device) -> bool:
    """Whether attention layer `attn` (on `device`) can take the fused pass (see LayerStats)."""
    return (device.type == "cuda" and triton_available() and attn.impl == "fused"
            and attn.sdpa_backend in ("auto", "cudnn", "flash") and not attn.transforms
            and fused_pass_widths(attn.d_k, attn.d_v))


def enable(model, fused: bool = True) -> torch.Tensor:
    """Give every attention layer of `model` (an Andrea) its LayerStats; returns their shared flag.
    fused: let the layers that can (fused_pass_takes) compute their attention and the statistics in one pass.

    Call after the model is on its device and before it is compiled or captured."""
    device = next(model.parameters()).device
    flag = torch.ones(1, dtype=torch.int32, device=device)
    for block in model.blocks:
        attn = block.attn
        attn.stats = LayerStats(attn.n_head, attn.scale, flag, bool(fused) and fused_pass_takes(attn, device),
                                cudnn_backward_fits(attn.sdpa_backend, device)).train(attn.training)
    if device.type == "cuda" and triton_available():  # Triton imported here, outside any compiled code
        import andrea_exp.model.attn_fwd_stats_kernel  # noqa: F401
        import andrea_exp.model.step_stats_kernel  # noqa: F401
    return flag
