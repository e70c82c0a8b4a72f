"""Pure functions on tensors: attention peakiness, score statistics over visible entries, gradient norms.

Conventions. A pattern or score tensor has shape (..., T_q, T_k); the leading dims are usually (B, H).
Key j is visible to query i unless the causal mask hides it (j > i + T_k - T_q, i.e. j > i when
T_q == T_k). Which entries are masked is decided by the causal flag, never by looking at values, so
a finite mask fill such as -1e9 is excluded exactly like -inf. Logs are natural logs.
"""

from __future__ import annotations

import math

import torch

from andrea_exp.attention import future_mask

SATURATION = 0.99  # a row whose largest probability exceeds this is "saturated" (one key takes it all)


def visible_keys(t_q: int, t_k: int, causal: bool, device=None) -> torch.Tensor:
    """(t_q, t_k) bool, True where query i may attend to key j."""
    if not causal:
        return torch.ones(t_q, t_k, dtype=torch.bool, device=device)
    return ~future_mask(t_q, t_k, device)


def visible_count(t_q: int, t_k: int, causal: bool, device=None) -> torch.Tensor:
    """(t_q,) number of keys each query sees: i + 1 when causal (T_q == T_k), t_k otherwise."""
    return visible_keys(t_q, t_k, causal, device).sum(-1)


def row_entropy(pattern: torch.Tensor) -> torch.Tensor:
    """(..., T_q, T_k) probabilities -> (..., T_q) entropy -sum_j p log p, with 0 log 0 = 0."""
    return -torch.special.xlogy(pattern, pattern).sum(-1)


def normalized_entropy(entropy: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    """Entropy / log(number of visible keys): 1 for a uniform row, 0 for one-hot.

    entropy (..., T_q), n_visible (T_q,). Rows with a single visible key (log 1 = 0) come out nan.
    """
    log_n = n_visible.to(entropy.dtype).log()  # (T_q,)
    return torch.where(n_visible > 1, entropy / log_n.clamp_min(1e-30), torch.full_like(entropy, math.nan))


def row_max_prob(pattern: torch.Tensor) -> torch.Tensor:
    """(..., T_q, T_k) -> (..., T_q) the largest probability in each row."""
    return pattern.amax(-1)


def saturated_rows(pattern: torch.Tensor, threshold: float = SATURATION) -> torch.Tensor:
    """(..., T_q, T_k) -> (..., T_q) bool, True where the largest probability exceeds threshold."""
    return row_max_prob(pattern) > threshold


def masked_std(scores: torch.Tensor, visible: torch.Tensor, dims) -> torch.Tensor:
    """Population std (divide by N) of scores over the visible entries, reducing `dims`.

    The mean it is taken around is also over visible entries only. visible broadcasts against scores.
    """
    visible = visible.expand_as(scores)
    count = visible.sum(dim=dims).clamp_min(1)
    s = scores.float()
    mean = torch.where(visible, s, 0.0).sum(dim=dims, keepdim=True) / count.view(_kept_shape(s, dims))
    sq = torch.where(visible, (s - mean) ** 2, 0.0)  # masked -inf gives inf here; where drops it
    return (sq.sum(dim=dims) / count).sqrt()


def masked_max(scores: torch.Tensor, visible: torch.Tensor, dims) -> torch.Tensor:
    """Largest score over the visible entries, reducing `dims`."""
    return torch.where(visible, scores.float(), -math.inf).amax(dim=dims)


def _kept_shape(t: torch.Tensor, dims) -> list[int]:
    dims = {d % t.dim() for d in (dims if isinstance(dims, (tuple, list)) else (dims,))}
    return [1 if i in dims else n for i, n in enumerate(t.shape)]


def global_norm(tensors) -> torch.Tensor:
    """Global L2 norm of a list of tensors (None entries skipped): sqrt of the sum of all squares."""
    norms = [t.detach().float().norm() for t in tensors if t is not None]
    if not norms:
        return torch.zeros(())
    return torch.stack(norms).norm()


def head_attention_stats(scores: torch.Tensor, pattern: torch.Tensor, causal: bool) -> dict[str, torch.Tensor]:
    """Per-head statistics. scores, pattern: (..., B, H, T_q, T_k), e.g. (L, B, H, T, T) for all layers
    at once; every value has shape (..., H).

    entropy, max_prob, saturated_frac: mean over the batch and query rows of the row quantity
    (a causal row 0 sees one key, so it is always saturated: a floor of 1/T on saturated_frac).
    entropy_norm: mean over rows with more than one visible key (row 0 of a causal head is left out).
    score_std, score_max: std and max over every visible entry of the head (batch, rows and keys
    pooled), so the mask fill never enters them.
    """
    rows = (-3, -1)  # batch and query rows of a (..., B, H, T_q) row quantity
    t_q, t_k = pattern.shape[-2:]
    visible = visible_keys(t_q, t_k, causal, pattern.device)  # (T_q, T_k)
    n_vis = visible.sum(-1)  # (T_q,)
    pattern = pattern.float()
    ent = row_entropy(pattern)  # (..., B, H, T_q)
    kept = (n_vis > 1).expand_as(ent)  # (..., B, H, T_q)
    n_kept = kept.sum(rows)  # (..., H)
    ent_norm = torch.where(kept, normalized_entropy(ent, n_vis), 0.0).sum(rows) / n_kept.clamp_min(1)
    ent_norm = torch.where(n_kept > 0, ent_norm, math.nan)  # no row can be normalised when T_k == 1
    scores = scores.detach()
    return {
        "entropy": ent.mean(rows),
        "entropy_norm": ent_norm,
        "max_prob": row_max_prob(pattern).mean(rows),
        "saturated_frac": saturated_rows(pattern).float().mean(rows),
        "score_std": masked_std(scores, visible, (-4, -2, -1)),
        "score_max": masked_max(scores, visible, (-4, -2, -1)),
    }


def component_std(t: torch.Tensor, dims=None) -> torch.Tensor:
    """Population std of the components of t over `dims` (all by default), e.g. q of a layer, heads pooled."""
    return t.detach().float().std(dim=dims, correction=0)
