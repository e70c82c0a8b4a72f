"""The every-step attention statistics' layout, shared by the PyTorch path (step_stats) and the Triton kernels
(step_stats_kernel, attn_fwd_stats_kernel): which statistics, in what order, over which query rows the
normalised entropy averages, and which operands the fused pass takes."""

import torch

STATS = ("score_max", "entropy", "entropy_norm", "max_prob", "max_prob_max", "saturated_frac")
N_STATS = len(STATS)


def kept_rows(T: int, causal: bool) -> int:
    """Query rows with more than one visible key (those entropy_norm averages over)."""
    return T - 1 if causal else (T if T > 1 else 0)


STATS_PASS_MAX_HEAD_DIM = 128  # the fused pass keeps the q block and the output accumulator in registers


def fused_pass_supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the fused pass takes these operands: bf16 / fp16 on CUDA, one width for q, k and v up to
    STATS_PASS_MAX_HEAD_DIM and a multiple of 8 (as the cuDNN and flash backwards need), as many keys as queries."""
    return (q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and k.dtype == v.dtype == q.dtype
            and q.shape == k.shape == v.shape and q.size(-1) <= STATS_PASS_MAX_HEAD_DIM and q.size(-1) % 8 == 0)
