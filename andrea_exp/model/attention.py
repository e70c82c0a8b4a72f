"""softmax(mask(Q K^T * scale)) V, stage by stage, beside the fused kernel.

The explicit path keeps every stage of the formula as a named tensor (scores, pattern) so probes
can read them and take gradients through them. The fused path hands the same computation to
``scaled_dot_product_attention``. Both must agree within dtype tolerance for every setting.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from andrea_exp.config.variants import (  # noqa: F401  (SDPA_MAX_HEAD_DIM, prefer_fused: re-exported API)
    SDPA_BACKEND_NAMES,
    SDPA_MAX_HEAD_DIM,
    normalize_mask_fill,
    prefer_fused,
    scale_factor,
)
from andrea_exp.model.head_gemms import qk_scores
from andrea_exp.model.visibility import visible_keys as visible_key_matrix

# `model.sdpa_backend`: which of scaled_dot_product_attention's kernels the fused path may use
# ("auto" leaves the choice to PyTorch, which prefers flash over cuDNN).
SDPA_BACKENDS = dict(zip(SDPA_BACKEND_NAMES, (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                              SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH), strict=True))


def future_mask(t_q: int, t_k: int, device=None) -> torch.Tensor:
    """True where key j lies in the future of query i (j > i), shape (t_q, t_k): the keys the causal mask hides."""
    return ~visible_key_matrix(t_q, t_k, True, device)


def absent_keys(visible_keys: torch.Tensor, t_k: int) -> torch.Tensor:
    """True where key j lies beyond batch row b's visible keys (j >= visible_keys[b]), shape (B, t_k).

    visible_keys (B,) gives each row the number of keys it has: row b behaves as if its sequence
    stopped at visible_keys[b] (evaluation of every prefix in one forward, see evaluate.loss_generation).
    """
    return torch.arange(t_k, device=visible_keys.device) >= visible_keys[:, None]  # (B, t_k)


def _fill_for(dtype: torch.dtype, mask_fill: float) -> float:
    """A finite fill such as -1e9 does not fit in float16 (max 65504): use the dtype's lowest value,
    which still gives a probability of exactly 0 after the float32 softmax."""
    if math.isfinite(mask_fill):
        return max(mask_fill, torch.finfo(dtype).min)
    return mask_fill


def explicit_attention(q, k, v, *, scale: float, causal: bool, mask_fill: float = -math.inf, stages=None,
                       visible_keys=None, heads_first: bool = False, transforms=()):
    """The formula written out. q, k: (B, H, T, d_k); v: (B, H, T, d_v).

    When `stages` is a dict, it receives the named intermediates: `scores` (scaled and masked,
    before softmax; it retains its gradient, so d loss / d scores can be read after backward)
    and `pattern` (the probabilities).
    visible_keys (B,), when given, leaves batch row b only keys j < visible_keys[b]: the others get
    -inf whatever mask_fill is (they are absent, not masked the way the model masks), so their
    attention weight is exactly 0. heads_first: q, k, v are (H, B, T, d), batch on dim 1.
    transforms: functions of the scaled scores applied before the mask, in order (config.variants'
    SCORE_TRANSFORMS, bound by score_transforms).
    """
    scores = qk_scores(q, k)  # (B, H, T, T) = q @ k^T, its gradients written contiguous
    scores = scores * scale
    for transform in transforms:
        scores = transform(scores)  # (B, H, T, T)
    if causal:
        future = future_mask(q.size(-2), k.size(-2), q.device)  # (T, T)
        scores = scores.masked_fill(future, _fill_for(scores.dtype, mask_fill))
    if visible_keys is not None:
        absent = absent_keys(visible_keys, k.size(-2))  # (B, T)
        absent = absent[None, :, None] if heads_first else absent[:, None, None]  # (1, B, 1, T) or (B, 1, 1, T)
        scores = scores.masked_fill(absent, -math.inf)  # on top of the causal fill: absent keys always -inf
    if stages is not None and scores.requires_grad:
        scores.retain_grad()
    # float32 at least for a stable softmax; float64 inputs keep float64
    pattern = torch.softmax(scores.to(torch.promote_types(scores.dtype, torch.float32)), dim=-1)  # (B, H, T, T)
    out = pattern.to(v.dtype) @ v  # (B, H, T, d_v)
    if stages is not None:
        stages["scores"] = scores
        stages["pattern"] = pattern
    return out, pattern


def check_sdpa_backend(backend: str) -> str:
    if backend != "auto" and backend not in SDPA_BACKENDS:
        raise ValueError(f"model.sdpa_backend must be one of auto, {', '.join(SDPA_BACKENDS)}; got {backend!r}")
    return backend


def sdpa_context(backend: str = "auto"):
    """A context that restricts scaled_dot_product_attention to one kernel ("auto": no restriction)."""
    if check_sdpa_backend(backend) == "auto":
        return contextlib.nullcontext()
    return sdpa_kernel(SDPA_BACKENDS[backend])


# Inference over many sequence lengths (generation, prefix-batched generation loss): cuDNN's attention builds
# an execution plan for every new shape (about 15 ms each on an H200, more than the forward itself), so those
# loops leave it out; a backend the model forces (model.sdpa_backend) still wins inside fused_attention.
VARYING_SHAPE_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def varying_shape_context():
    """A context for loops whose attention shapes change call after call (see VARYING_SHAPE_BACKENDS)."""
    return sdpa_kernel(list(VARYING_SHAPE_BACKENDS))


def fused_attention(q, k, v, *, scale: float, causal: bool, backend: str = "auto", visible_keys=None):
    """The same computation through PyTorch's fused kernels (flash / cuDNN / efficient / math).

    SDPA's is_causal aligns the mask to the top-left corner; when there are fewer queries than keys
    (the queries are the last positions) the explicit path's bottom-right mask is passed instead.
    `backend` forces one kernel (see SDPA_BACKENDS); a kernel that cannot take the shape raises.
    visible_keys (B,): as in explicit_attention, keys j >= visible_keys[b] are absent for batch row b,
    passed as a boolean attn_mask (flash takes none: a masked call needs another kernel).
    """
    t_q, t_k = q.size(-2), k.size(-2)
    with sdpa_context(backend):
        if visible_keys is not None:
            allowed = ~absent_keys(visible_keys, t_k)[:, None, None]  # (B, 1, 1, t_k), True where attention is allowed
            if causal:  # is_causal cannot be combined with attn_mask: both masks in one
                allowed = allowed & ~future_mask(t_q, t_k, q.device)  # (B, 1, t_q, t_k)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)  # (B, H, t_q, d_v)
        if causal and t_q != t_k:
            visible = ~future_mask(t_q, t_k, q.device)  # (t_q, t_k), True where attention is allowed
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)  # (B, H, t_q, d_v)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)  # (B, H, T, d_v)


class Mask(NamedTuple):
    """Which keys the queries of one call see: when causal, visibility.key_visible's (the hidden scores filled with
    `fill`; the fused kernels take -inf only); when visible_keys (B,) is given, batch row b only keys
    j < visible_keys[b], the others absent (absent_keys: -inf whatever the fill, weight exactly 0)."""

    causal: bool
    fill: float = -math.inf
    visible_keys: torch.Tensor | None = None


# The attention layer's paths (model.attn_impl as config.variants.resolve_attn_impl resolves it, once per layer;
# "captured" while a probe reads the stages): softmax(mask(transforms(q k^T * scale))) v from q, k (B, H, T, d_k),
# v (B, H, T, d_v) and the mask, each -> (B, H, T, d_v).


def sdpa_path(q, k, v, mask: Mask, *, scale: float, transforms=(), backend: str = "auto", stages=None):
    """fused: PyTorch's kernels (fused_attention); no score transform ever takes this path (config.variants)."""
    if backend == "flash" and mask.visible_keys is not None:  # flash takes no attn_mask: PyTorch picks a kernel
        backend = "auto"  # that does (visible_keys: evaluation only)
    return fused_attention(q, k, v, scale=scale, causal=mask.causal, backend=backend, visible_keys=mask.visible_keys)


def head_major_path(q, k, v, mask: Mask, *, scale: float, transforms=(), backend: str = "auto", stages=None):
    """explicit, bilinear: the formula on views of head-major (H, B, T, .) tensors (Attention.operands): with heads
    first, (H, B) fold into one batch dimension of contiguous tensors, so q k^T and its backward run as plain
    batched GEMMs (see head_gemms)."""
    out, _ = explicit_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale=scale,
                                causal=mask.causal, mask_fill=mask.fill, visible_keys=mask.visible_keys,
                                heads_first=True, transforms=transforms)  # (H, B, T, d_v)
    return out.transpose(0, 1)  # (B, H, T, d_v)


def captured_path(q, k, v, mask: Mask, *, scale: float, transforms=(), backend: str = "auto", stages=None):
    """A probe's capture: the formula batch-first, q, k and every stage named in the dict `stages`."""
    stages["q"], stages["k"] = q, k
    out, _ = explicit_attention(q, k, v, scale=scale, causal=mask.causal, mask_fill=mask.fill, stages=stages,
                                visible_keys=mask.visible_keys, transforms=transforms)  # (B, H, T, d_v)
    return out


PATHS = {"fused": sdpa_path, "explicit": head_major_path, "bilinear": head_major_path, "captured": captured_path}
HEAD_MAJOR = ("explicit", "bilinear")  # the paths whose q, k, v are views of head-major tensors


def attention(q, k, v, *, scale="sqrt", causal=True, mask_fill=float("-inf"), return_probs=False,
              impl="auto"):
    """Public entry: softmax(mask(q k^T * scale)) v.

    scale: "sqrt" (1/sqrt(d_k)), "none" (1), "inv" (1/d_k), or true / false.
    impl: "auto" picks the faster path for d_k, "explicit" or "fused" forces one.
    With return_probs=True the explicit path always runs and (out, probs) is returned.
    """
    factor = scale_factor(scale, q.size(-1))
    fill = normalize_mask_fill(mask_fill)
    if impl not in ("auto", "explicit", "fused"):
        raise ValueError(f"impl must be one of auto, explicit, fused; got {impl!r}")
    use_fused = impl == "fused" or (impl == "auto" and prefer_fused(q.size(-1), v.size(-1), fill))
    if return_probs or not use_fused:
        out, probs = explicit_attention(q, k, v, scale=factor, causal=causal, mask_fill=fill)
        return (out, probs) if return_probs else out
    return fused_attention(q, k, v, scale=factor, causal=causal)
