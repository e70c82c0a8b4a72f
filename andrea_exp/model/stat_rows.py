"""The every-step attention statistics' layout, shared by the PyTorch path (step_stats) and the Triton kernels
(step_stats_kernel, attn_fwd_stats_kernel): which statistics, in what order, over which query rows the
normalised entropy averages (visibility.kept_rows), and which operands the fused pass takes."""

import torch

from andrea_exp.model.visibility import kept_rows  # noqa: F401  (the rows entropy_norm averages over)

STATS = ("score_max", "entropy", "entropy_norm", "max_prob", "max_prob_max", "saturated_frac")
N_STATS = len(STATS)

STATS_PASS_MAX_HEAD_DIM = 128  # the fused pass keeps the q block and the output accumulator in registers
HALF = (torch.bfloat16, torch.float16)  # the fused pass's dtypes


def fused_pass_widths(d_k: int, d_v: int) -> bool:
    """Whether the fused pass takes heads of these widths: one width for q, k and v, up to STATS_PASS_MAX_HEAD_DIM
    and a multiple of 8 (as the cuDNN and flash backwards need)."""
    return d_k == d_v and d_k <= STATS_PASS_MAX_HEAD_DIM and d_k % 8 == 0


def fused_pass_supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the fused pass takes these operands: bf16 / fp16 on CUDA, widths it takes (fused_pass_widths), as
    many keys as queries."""
    return (q.is_cuda and q.dtype in HALF and k.dtype == v.dtype == q.dtype and q.shape == k.shape == v.shape
            and fused_pass_widths(q.size(-1), v.size(-1)))
