"""Two GEMMs of the explicit attention path whose gradients are written in their inputs' own layouts.

Autograd's matmul backward returns the gradient of a transposed operand as a transposed view, and the
next node then copies it with a strided, transposing kernel: at d_k 4096 these copies (q-sized tensors
and the q / k weights) cost as much as the GEMMs. Each Function below computes the same product and
writes both gradients contiguous instead. Under autocast both take the autocast dtype, as matmul would;
autograd casts each gradient back to its input's dtype.
"""

from __future__ import annotations

import torch


def _gemm_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype matmul would compute in: autocast's for float32 inputs under autocast, else the promoted one."""
    device_type = tensors[0].device.type
    autocast = torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)
    if autocast and all(t.dtype in (torch.float32, torch.get_autocast_dtype(device_type)) for t in tensors):
        return torch.get_autocast_dtype(device_type)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


class QKScores(torch.autograd.Function):
    """q @ k^T over any leading dims: q (..., T_q, d), k (..., T_k, d) -> (..., T_q, T_k)."""

    @staticmethod
    def forward(ctx, q, k):
        dtype = _gemm_dtype(q, k)
        q, k = q.to(dtype), k.to(dtype)
        ctx.save_for_backward(q, k)
        return q @ k.transpose(-2, -1)

    @staticmethod
    def backward(ctx, grad):
        q, k = ctx.saved_tensors  # grad has the output's dtype, which is theirs
        grad_q = grad @ k if ctx.needs_input_grad[0] else None  # (..., T_q, d)
        grad_k = grad.transpose(-2, -1) @ q if ctx.needs_input_grad[1] else None  # (..., T_k, d), contiguous
        return grad_q, grad_k


class HeadProjection(torch.autograd.Function):
    """x (N, C), shared by every head, through each head's weight (H, w, C): (H, N, w) = x W_h^T per head.

    x is broadcast over heads by an expand (stride 0, no copy); the weight's gradient is computed as
    grad^T x, already in the (H, w, C) layout of the parameter it flows to."""

    @staticmethod
    def forward(ctx, x, weight):
        dtype = _gemm_dtype(x, weight)
        x, weight = x.to(dtype), weight.to(dtype)
        ctx.save_for_backward(x, weight)
        rows = x.unsqueeze(0).expand(weight.size(0), *x.shape)  # (H, N, C)
        return torch.bmm(rows, weight.transpose(1, 2))  # (H, N, w)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors  # grad has the output's dtype, which is theirs
        grad_x = torch.bmm(grad, weight).sum(0) if ctx.needs_input_grad[0] else None  # (N, C)
        rows = x.unsqueeze(0).expand(weight.size(0), *x.shape)  # (H, N, C)
        grad_w = torch.bmm(grad.transpose(1, 2), rows) if ctx.needs_input_grad[1] else None  # (H, w, C)
        return grad_x, grad_w


def qk_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q @ k^T (see QKScores)."""
    return QKScores.apply(q, k)


def head_projection(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(N, C) x (H, w, C) -> (H, N, w) (see HeadProjection)."""
    return HeadProjection.apply(x, weight)
