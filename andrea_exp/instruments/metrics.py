"""Pure functions on tensors: attention peakiness, score statistics over visible entries, gradient norms,
per-row softmax Jacobian and gradient statistics, and the spectral norm of the query-key form.

Conventions. A pattern or score tensor has shape (..., T_q, T_k); the leading dims are usually (B, H).
Key j is visible to query i as model.visibility.key_visible says (the causal mask hides j > i + T_k - T_q, i.e.
j > i when T_q == T_k). Which entries are masked is decided by the causal flag, never by looking at values, so
a finite mask fill such as -1e9 is excluded exactly like -inf. Logs are natural logs.
"""

from __future__ import annotations

import math

import torch

from andrea_exp.model.visibility import (  # noqa: F401  (first_kept_row: the probe's and the tests' name here)
    first_kept_row,
    visible_count,
    visible_keys,
)
from andrea_exp.runs.metric_keys import SATURATION  # noqa: F401  (metrics.SATURATION, the probe's threshold)


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


# ---------------------------------------------------------------- per-row instruments
# "Gradients vanish elsewhere" is a statement about rows: a total norm can be carried by a few live
# rows while most are dead. These functions reduce (..., N) row quantities without host syncs.

QUANTILES = (0.1, 0.5, 0.9)
TOP_SHARE = 0.1  # grad/scores_top10_share: the share carried by the top 10% of rows


def softmax_jacobian_norm(pattern: torch.Tensor) -> torch.Tensor:
    """(..., T_k) probabilities -> (...) Frobenius norm of the softmax Jacobian J = diag(p) - p p^T.

    Closed form: ||J||_F^2 = sum_i p_i^2 (1 - p_i)^2 + sum_{i!=j} p_i^2 p_j^2
                           = S2 - 2 S3 + S2^2,  S_k = sum_i p_i^k.
    Written that way it cancels catastrophically for a nearly one-hot row (S2 ~ 1, the answer ~ 1e-3), so
    it is evaluated with the row's largest entry m split off: with R_k = sum of p_j^k over the other
    entries (and 1 - m = R1), the same sum is
        ||J||_F^2 = m^2 (R1^2 + 2 R2) + R2 (1 + R2) - 2 R3,
    where the one subtraction is bounded: every other entry is <= 1/2, so R2 - 2 R3 >= 0. Masked entries
    (p = 0) add nothing. Computed in float32 at least.
    """
    p = pattern.to(torch.promote_types(pattern.dtype, torch.float32))
    m, top = p.max(-1, keepdim=True)  # (..., 1)
    rest = p.scatter(-1, top, 0.0)  # (..., T_k): the row with its (first) largest entry zeroed
    rest_sq = rest * rest
    r1, r2, r3 = rest.sum(-1), rest_sq.sum(-1), (rest_sq * rest).sum(-1)  # (...)
    m = m.squeeze(-1)
    squared = m * m * (r1 * r1 + 2 * r2) + r2 * (1 + r2) - 2 * r3
    return squared.clamp_min(0).sqrt()


def sorted_quantiles(sorted_values: torch.Tensor, qs=QUANTILES) -> torch.Tensor:
    """(..., N) values sorted ascending along the last dim -> (..., len(qs)) quantiles.

    Linear interpolation between order statistics (numpy's and torch.quantile's default): position
    q (N - 1). Unlike torch.quantile it has no input size limit. nan when N == 0.
    """
    n = sorted_values.size(-1)
    if n == 0:
        return torch.full((*sorted_values.shape[:-1], len(qs)), math.nan, device=sorted_values.device)
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        a, b = sorted_values[..., lo], sorted_values[..., hi]
        out.append(a + (pos - lo) * (b - a))
    return torch.stack(out, -1)


def top_share(sorted_weights: torch.Tensor, frac: float = TOP_SHARE) -> torch.Tensor:
    """(..., N) non-negative weights sorted ascending -> (...) share of their sum held by the largest
    ceil(frac * N) of them. nan when the sum is 0 (no weight to share) or N == 0."""
    n = sorted_weights.size(-1)
    k = math.ceil(frac * n)
    total = sorted_weights.sum(-1)
    top = sorted_weights[..., n - k:].sum(-1)
    return torch.where(total > 0, top / total.clamp_min(torch.finfo(total.dtype).tiny), math.nan)


def row_gradient_stats(row_norms: torch.Tensor, dead: float) -> dict[str, torch.Tensor]:
    """(..., N) per-row gradient norms ||d loss / d S_i|| -> statistics over the last dim, each (...).

    row_p10 / row_p50 / row_p90: quantiles; dead_frac: share of rows with norm < dead;
    top10_share: share of the summed squared norms carried by the top 10% of rows.
    """
    ranked = row_norms.float().sort(-1).values  # (..., N) ascending
    quantiles = sorted_quantiles(ranked)  # (..., 3)
    return {
        "row_p10": quantiles[..., 0],
        "row_p50": quantiles[..., 1],
        "row_p90": quantiles[..., 2],
        "dead_frac": (ranked < dead).float().mean(-1),
        "top10_share": top_share(ranked * ranked),
    }


# ---------------------------------------------------------------- the query-key bilinear form

POWER_SQUARINGS = 32  # M -> M^(2^32): eigenvalue gaps above ~1e-8 (relative) are resolved; smaller ones bound the error


def top_eigenvalue(m: torch.Tensor, squarings: int = POWER_SQUARINGS) -> torch.Tensor:
    """(..., n, n) diagonalisable matrices with real eigenvalues >= 0 -> (...) the largest eigenvalue.

    Repeated squaring with normalisation, P -> P^2 / ||P||_F, turns P into a multiple of the projector
    on the top eigenspace (every other eigenvalue ratio goes to 0 like r^(2^k)); then lambda =
    trace(M P) / trace(P). Only matmuls, so no host sync on a GPU (torch.linalg.svd and eigh sync). Close
    top eigenvalues that are not separated leave P mixing them: lambda is then a weighted mean of values
    that differ by less than the gap. Float64 inside. A zero matrix gives 0.
    """
    m = m.detach().double()
    tiny = torch.finfo(torch.float64).tiny

    def normalised(x):
        return x / torch.linalg.matrix_norm(x).clamp_min(tiny)[..., None, None]

    p = normalised(m)
    for _ in range(squarings):
        p = normalised(p @ p)
    trace_p = p.diagonal(dim1=-2, dim2=-1).sum(-1)
    trace_mp = (m * p.mT).sum((-2, -1))  # trace(M P)
    return torch.where(trace_p > 0, trace_mp / trace_p.clamp_min(tiny), 0.0).clamp_min(0)


def qk_spectral_norm(w_q: torch.Tensor, w_k: torch.Tensor, n_head: int, scale: float) -> torch.Tensor:
    """Largest singular value of each head's logit form scale * W_q^h^T W_k^h (d_model x d_model).

    w_q, w_k: (..., H * d_k, d_model) weights of nn.Linear q and k projections (no bias), x -> W x, so
    head h's logit is scale * x_i^T (W_q^h^T W_k^h) x_j with W^h the h-th block of d_k rows. Returns (..., H).

    sigma^2 are the eigenvalues of F F^T, F = W_q^h^T W_k^h. When d_k <= d_model the same nonzero values
    are the eigenvalues of the d_k x d_k product (W_q^h W_q^h^T)(W_k^h W_k^h^T), which is cheaper.
    """
    *lead, rows, d_model = w_q.shape
    if rows % n_head:
        raise ValueError(f"qk_spectral_norm: {rows} projection rows do not split into n_head={n_head} heads")
    d_k = rows // n_head
    a = w_q.detach().double().reshape(*lead, n_head, d_k, d_model)  # (..., H, d_k, d_model)
    b = w_k.detach().double().reshape(*lead, n_head, d_k, d_model)
    if d_k <= d_model:
        gram = (a @ a.mT) @ (b @ b.mT)  # (..., H, d_k, d_k)
    else:
        form = a.mT @ b  # (..., H, d_model, d_model)
        gram = form @ form.mT
    return (abs(scale) * top_eigenvalue(gram).sqrt()).float()


def qk_layernorm_spectral_norm(gain_q: torch.Tensor, gain_k: torch.Tensor, scale: float) -> torch.Tensor:
    """With QK-LayerNorm the logit is scale * LN(q) . LN(k): the projections' size is normalised away.

    gain_q, gain_k: (..., d_k) LayerNorm weights. Returns (...) the largest singular value of
    scale * C diag(gain_q * gain_k) C, C = I - 1 1^T / d_k (LayerNorm centres each vector): the form
    that turns the standardised query and key (zero mean, norm ~ sqrt(d_k)) into the logit. The
    LayerNorm biases are left out: the key's shifts a whole row, which softmax ignores; the query's
    adds a term linear in the key, not a bilinear one.
    """
    g = gain_q.detach().double() * gain_k.detach().double()  # (..., d_k)
    return (abs(scale) * centred_diagonal_norm(g)).float()


def centred_diagonal_norm(g: torch.Tensor, iterations: int = 100) -> torch.Tensor:
    """(..., n) -> (...) the largest singular value of C diag(g) C, C = I - 1 1^T / n, without the n x n matrix.

    On the hyperplane orthogonal to 1 the eigenvalues mu of C diag(g) C solve sum_i 1 / (g_i - mu) = 0
    (an eigenproblem under one linear constraint); they interlace the sorted g, so the largest lies in
    [g_(n-1), g_(n)] and the smallest in [g_(1), g_(2)], and the left side increases with mu there.
    Bisection finds both in O(n) per step with a fixed number of steps: no host sync on a GPU, and
    none of the O(n^3) work a 4096 x 4096 matrix would cost. Tied gains give the tied value exactly.
    """
    s = torch.sort(g.detach().double(), dim=-1).values  # (..., n)
    if s.size(-1) < 2:
        return torch.zeros(s.shape[:-1], dtype=torch.float64, device=s.device)  # C = 0

    def root(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        for _ in range(iterations):
            mid = (lo + hi) / 2
            positive = (1.0 / (s - mid[..., None])).sum(-1) > 0  # root left of mid
            lo, hi = torch.where(positive, lo, mid), torch.where(positive, mid, hi)
        return (lo + hi) / 2

    top = root(s[..., -2], s[..., -1])
    bottom = root(s[..., 0], s[..., 1])
    return torch.maximum(top.abs(), bottom.abs())
