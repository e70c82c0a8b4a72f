"""Which keys a query sees: the one rule that the explicit path's mask, the fused path's attn_mask, the statistics
(their PyTorch path, their row layout, the Triton kernels' key ranges, tested against it) and the probe's metrics
all follow.

The t_q queries are the last t_q of the t_k positions (t_q == t_k in training; fewer queries than keys when they
continue a longer context), so query i stands at position i + t_k - t_q. With the causal mask key j is visible
to it when j is at or before that position; without it every key is.
"""

from __future__ import annotations

import functools

import torch


def key_visible(i, j, t_q: int, t_k: int, causal: bool):
    """Whether key j is visible to query i: positions as ints, or as tensors that broadcast (then a bool tensor of
    their broadcast shape)."""
    return (j <= i + (t_k - t_q)) | (not causal)


def visible_keys(t_q: int, t_k: int, causal: bool, device=None) -> torch.Tensor:
    """(t_q, t_k) bool, True where query i may attend to key j."""
    i = torch.arange(t_q, device=device)[:, None]  # (t_q, 1)
    j = torch.arange(t_k, device=device)[None, :]  # (1, t_k)
    return key_visible(i, j, t_q, t_k, causal)  # (t_q, t_k)


def visible_count(t_q: int, t_k: int, causal: bool, device=None) -> torch.Tensor:
    """(t_q,) number of keys each query sees: i + 1 when causal (t_q == t_k), t_k otherwise."""
    return visible_keys(t_q, t_k, causal, device).sum(-1)


@functools.lru_cache(maxsize=64)  # read at every step by the statistics' kernels' host code: the (t_q, t_k) count once
def first_kept_row(t_q: int, t_k: int, causal: bool) -> int:
    """Index of the first query row with more than one visible key; the kept rows (those a normalised entropy can
    average over) are that row onwards.

    The number of visible keys never decreases with the row, so the kept rows are a suffix and a slice (not a
    boolean mask, which would sync with the host on a GPU) selects them. t_q when none is kept.
    """
    return int((visible_count(t_q, t_k, causal) <= 1).sum())


def kept_rows(t: int, causal: bool) -> int:
    """Number of query rows of a (t, t) self-attention with more than one visible key."""
    return t - first_kept_row(t, t, causal)
