"""The metric functions on cases worked out by hand."""

import math

import pytest
import torch

from andrea_exp.instruments.metrics import (
    component_std,
    first_kept_row,
    global_norm,
    head_attention_stats,
    masked_max,
    masked_std,
    normalized_entropy,
    qk_layernorm_spectral_norm,
    qk_spectral_norm,
    row_entropy,
    row_gradient_stats,
    row_max_prob,
    saturated_rows,
    softmax_jacobian_norm,
    sorted_quantiles,
    top_eigenvalue,
    top_share,
    visible_count,
    visible_keys,
)
from andrea_exp.model.attention import attention, explicit_attention


def test_uniform_row_has_entropy_log_n_and_one_hot_zero():
    n = 7
    uniform = torch.full((1, n), 1.0 / n)
    one_hot = torch.zeros(1, n)
    one_hot[0, 3] = 1.0
    assert row_entropy(uniform).item() == pytest.approx(math.log(n), rel=1e-6)
    assert row_entropy(one_hot).item() == 0.0  # 0 log 0 = 0, not nan


def test_entropy_of_a_mixed_row_by_hand():
    row = torch.tensor([[0.5, 0.25, 0.25, 0.0]])
    # -(0.5 ln 0.5 + 2 * 0.25 ln 0.25) = 0.5 ln 2 + ln 2 = 1.5 ln 2
    assert row_entropy(row).item() == pytest.approx(1.5 * math.log(2), rel=1e-6)


def test_visible_keys_causal_and_full():
    assert visible_count(4, 4, causal=True).tolist() == [1, 2, 3, 4]
    assert visible_count(4, 4, causal=False).tolist() == [4, 4, 4, 4]
    assert visible_keys(3, 3, causal=True).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_normalized_entropy_is_one_for_uniform_over_visible_and_nan_for_single_key_rows():
    T = 4
    pattern = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1).unsqueeze(1)  # uniform over keys 0..i
    norm = normalized_entropy(row_entropy(pattern), visible_count(T, T, causal=True))
    assert math.isnan(norm[0].item())
    assert norm[1:].tolist() == pytest.approx([1.0, 1.0, 1.0], rel=1e-6)


def test_max_prob_and_saturation():
    pattern = torch.tensor([[1.0, 0.0, 0.0], [0.995, 0.005, 0.0], [0.99, 0.01, 0.0], [0.2, 0.3, 0.5]])
    assert row_max_prob(pattern).tolist() == pytest.approx([1.0, 0.995, 0.99, 0.5])
    assert saturated_rows(pattern).tolist() == [True, True, False, False]  # strictly above 0.99


@pytest.mark.parametrize("fill", [-math.inf, -1e9])
def test_masked_entries_carry_no_mass_and_stay_out_of_score_statistics(fill):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    stages = {}
    _, pattern = explicit_attention(q, k, v, scale=1.0, causal=True, mask_fill=fill, stages=stages)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert pattern[..., future].abs().max().item() == 0.0
    assert torch.allclose(pattern.sum(-1), torch.ones(2, 3, 5))
    # statistics from the visible raw dot products only, written out directly
    raw = q @ k.transpose(-2, -1)  # (2, 3, 5, 5)
    seen = torch.stack([raw[b, h][~future] for b in range(2) for h in range(3)]).view(2, 3, -1)  # (B, H, 15)
    per_head = seen.transpose(0, 1).reshape(3, -1)  # (H, B*15)
    want_std = ((per_head - per_head.mean(1, keepdim=True)) ** 2).mean(1).sqrt()
    stats = head_attention_stats(stages["scores"], pattern, causal=True)
    assert torch.allclose(stats["score_std"], want_std, rtol=1e-5)
    assert torch.allclose(stats["score_max"], per_head.max(1).values)


def test_masked_std_and_max_on_a_3x3_case():
    scores = torch.tensor([[1.0, -1e9, -1e9], [2.0, 4.0, -1e9], [0.0, 3.0, 6.0]])
    visible = visible_keys(3, 3, causal=True)
    values = torch.tensor([1.0, 2.0, 4.0, 0.0, 3.0, 6.0])  # mean 16/6
    mean = 16 / 6
    want = math.sqrt(sum((x - mean) ** 2 for x in values.tolist()) / 6)
    assert masked_std(scores, visible, (0, 1)).item() == pytest.approx(want, rel=1e-6)
    assert masked_max(scores, visible, (0, 1)).item() == 6.0
    # a -inf fill gives the same numbers: the mask, not the value, decides
    inf_scores = torch.where(visible, scores, -math.inf)
    assert masked_std(inf_scores, visible, (0, 1)).item() == pytest.approx(want, rel=1e-6)


def test_head_stats_on_a_hand_pattern():
    # one head, T = 3, causal: rows [1], [0.5, 0.5], [0.995, 0.005, 0]
    pattern = torch.tensor([[[[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.995, 0.005, 0.0]]]])
    scores = torch.tensor([[[[0.0, -math.inf, -math.inf], [1.0, 1.0, -math.inf], [5.0, 0.0, -2.0]]]])
    stats = head_attention_stats(scores, pattern, causal=True)
    h2 = -(0.995 * math.log(0.995) + 0.005 * math.log(0.005))
    assert stats["entropy"].item() == pytest.approx((0 + math.log(2) + h2) / 3, rel=1e-5)
    # row 0 (one visible key) is left out of the normalised mean
    assert stats["entropy_norm"].item() == pytest.approx((1.0 + h2 / math.log(3)) / 2, rel=1e-5)
    assert stats["max_prob"].item() == pytest.approx((1.0 + 0.5 + 0.995) / 3, rel=1e-6)
    assert stats["saturated_frac"].item() == pytest.approx(2 / 3)
    values = [0.0, 1.0, 1.0, 5.0, 0.0, -2.0]
    mean = sum(values) / 6
    assert stats["score_std"].item() == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in values) / 6), rel=1e-6)
    assert stats["score_max"].item() == 5.0


def test_entropy_norm_is_nan_when_no_row_has_two_keys():
    pattern = torch.ones(1, 2, 1, 1)
    stats = head_attention_stats(torch.zeros(1, 2, 1, 1), pattern, causal=True)
    assert torch.isnan(stats["entropy_norm"]).all()


@pytest.mark.parametrize("d_k", [64, 256, 4096])
def test_unscaled_score_std_is_sqrt_dk_and_scaled_is_one(d_k):
    """Components of unit variance: q.k sums d_k products of variance 1, so its std is sqrt(d_k)."""
    gen = torch.Generator().manual_seed(d_k)
    q = torch.randn(2, 2, 96, d_k, generator=gen)
    k = torch.randn(2, 2, 96, d_k, generator=gen)
    v = torch.randn(2, 2, 96, 4, generator=gen)
    visible = visible_keys(96, 96, causal=False)
    raw_stages, scaled_stages = {}, {}
    explicit_attention(q, k, v, scale=1.0, causal=False, stages=raw_stages)
    explicit_attention(q, k, v, scale=1.0 / math.sqrt(d_k), causal=False, stages=scaled_stages)
    raw_std = masked_std(raw_stages["scores"], visible, (0, 1, 2, 3)).item()
    scaled_std = masked_std(scaled_stages["scores"], visible, (0, 1, 2, 3)).item()
    assert raw_std == pytest.approx(math.sqrt(d_k), rel=0.05)
    assert scaled_std == pytest.approx(1.0, rel=0.05)
    # the public entry point with return_probs gives the same probabilities as the explicit stage
    _, probs = attention(q, k, v, scale="sqrt", causal=False, return_probs=True)
    assert torch.allclose(probs, scaled_stages["pattern"])


def test_global_norm_by_hand():
    assert global_norm([torch.tensor([3.0]), torch.tensor([[4.0]]), None]).item() == pytest.approx(5.0)
    assert global_norm([torch.tensor([1.0, 2.0]), torch.tensor([2.0])]).item() == pytest.approx(3.0)
    assert global_norm([]).item() == 0.0


def test_component_std_is_population_std():
    t = torch.tensor([[1.0, 3.0], [5.0, 7.0]])  # mean 4, squared deviations 9, 1, 1, 9
    assert component_std(t).item() == pytest.approx(math.sqrt(5.0))


# ---------------------------------------------------------------- softmax Jacobian, per row


def dense_jacobian_norm(p: torch.Tensor) -> torch.Tensor:
    """||diag(p) - p p^T||_F built as a matrix: (..., n) -> (...)."""
    return torch.linalg.matrix_norm(torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2))


def test_jacobian_norm_of_one_hot_is_zero_and_of_uniform_is_sqrt_1_over_n_minus_1_over_n2():
    for n in (1, 2, 5, 64):
        one_hot = torch.zeros(n)
        one_hot[n // 2] = 1.0
        assert softmax_jacobian_norm(one_hot).item() == 0.0
        uniform = torch.full((n,), 1.0 / n, dtype=torch.float64)
        assert softmax_jacobian_norm(uniform).item() == pytest.approx(math.sqrt(1 / n - 1 / n**2), rel=1e-12)
    # two keys: J = p1 p2 [[1, -1], [-1, 1]], Frobenius norm 2 p1 p2; ties at the max are fine
    assert softmax_jacobian_norm(torch.tensor([0.5, 0.5])).item() == pytest.approx(0.5)
    assert softmax_jacobian_norm(torch.tensor([0.8, 0.2])).item() == pytest.approx(2 * 0.8 * 0.2, rel=1e-6)


def test_jacobian_norm_matches_autograd_jacobian_of_softmax_and_the_power_sum_formula():
    gen = torch.Generator().manual_seed(0)
    for n, temperature in ((3, 1.0), (7, 4.0), (16, 0.3), (33, 10.0)):
        for _ in range(5):
            logits = torch.randn(n, generator=gen, dtype=torch.float64) * temperature
            jac = torch.autograd.functional.jacobian(lambda s: torch.softmax(s, -1), logits)  # (n, n)
            p = torch.softmax(logits, -1)
            s2, s3 = (p**2).sum(), (p**3).sum()
            closed = math.sqrt(s2 - 2 * s3 + s2**2)  # the formula in the form the brief writes it
            got = softmax_jacobian_norm(p).item()
            assert got == pytest.approx(torch.linalg.matrix_norm(jac).item(), rel=1e-10)
            # same quantity; the power-sum form loses digits to cancellation when the norm is small
            # (even in float64: 3e-7 relative at a norm of 1e-5), hence the looser tolerance
            assert got == pytest.approx(closed, rel=1e-9 / got**2)


def test_jacobian_norm_is_accurate_in_float32_for_nearly_one_hot_rows():
    """S2 - 2 S3 + S2^2 cancels catastrophically near one-hot (S2 ~ 1): about 15% off here in float32,
    right at the dead_jac scale. The split form keeps float32 within 1e-5 of the float64 truth."""
    logits = torch.tensor([[0.0, -9.0, -10.0, -12.0], [0.0, -14.0, -14.0, -30.0], [3.0, 3.0, -20.0, -20.0]],
                          dtype=torch.float64)
    truth = dense_jacobian_norm(torch.softmax(logits, -1))
    p32 = torch.softmax(logits.float(), -1)
    got = softmax_jacobian_norm(p32).double()
    assert torch.allclose(got, truth, rtol=1e-5, atol=0)
    s2, s3 = (p32**2).sum(-1), (p32**3).sum(-1)
    naive = (s2 - 2 * s3 + s2**2).clamp_min(0).sqrt().double()
    assert (naive[0] - truth[0]).abs() / truth[0] > 0.05  # why the split form is needed


def test_jacobian_norm_of_causal_rows_ignores_masked_zeros():
    T = 5
    pattern = torch.tril(torch.ones(T, T, dtype=torch.float64)) / torch.arange(1, T + 1).unsqueeze(1)
    want = [math.sqrt(1 / n - 1 / n**2) for n in range(1, T + 1)]
    assert softmax_jacobian_norm(pattern).tolist() == pytest.approx(want, rel=1e-12)
    assert first_kept_row(T, T, causal=True) == 1  # row 0 sees one key
    assert first_kept_row(T, T, causal=False) == 0
    assert first_kept_row(1, 1, causal=True) == 1  # nothing kept
    assert first_kept_row(2, 4, causal=True) == 0  # fewer queries than keys: the first sees 3


# ---------------------------------------------------------------- quantiles, shares, dead fractions


def test_sorted_quantiles_by_hand_and_against_torch_quantile():
    assert sorted_quantiles(torch.arange(11.0)).tolist() == pytest.approx([1.0, 5.0, 9.0])
    assert sorted_quantiles(torch.tensor([1.0, 2.0, 3.0, 4.0])).tolist() == pytest.approx([1.3, 2.5, 3.7])
    assert sorted_quantiles(torch.tensor([7.0])).tolist() == [7.0, 7.0, 7.0]
    assert torch.isnan(sorted_quantiles(torch.zeros(3, 0))).all()
    x = torch.rand(4, 37, generator=torch.Generator().manual_seed(1))
    want = torch.quantile(x, torch.tensor([0.1, 0.5, 0.9]), dim=-1).T  # (4, 3)
    assert torch.allclose(sorted_quantiles(x.sort(-1).values), want, atol=1e-6)


def test_top_share_by_hand():
    # 10 rows, one of squared weight 9 and nine of 1: the top ceil(10%) = 1 row holds 9 / 18
    weights = torch.tensor([1.0] * 9 + [9.0])
    assert top_share(weights).item() == pytest.approx(0.5)
    # 11 rows: ceil(1.1) = 2 rows, 9 + 1 of 19
    assert top_share(torch.tensor([1.0] * 10 + [9.0])).item() == pytest.approx(10 / 19)
    assert top_share(torch.ones(20)).item() == pytest.approx(0.1)  # equal rows: exactly their count share
    assert math.isnan(top_share(torch.zeros(10)).item())  # nothing to share


def test_row_gradient_stats_on_constructed_norms():
    # 10 rows: three dead (< 1e-6; 1e-6 itself is not below), then 1e-6 and norms 1..6
    norms = torch.tensor([0.0, 1e-9, 5e-7, 1e-6, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    shuffled = norms[torch.randperm(10, generator=torch.Generator().manual_seed(0))]
    got = row_gradient_stats(torch.stack([shuffled, shuffled * 2]), dead=1e-6)  # (2, 10): two "layers"
    assert got["dead_frac"].tolist() == pytest.approx([0.3, 0.2])  # doubled, 5e-7 reaches 1e-6
    ranked = norms.tolist()
    p10, p50, p90 = (ranked[0] + 0.9 * (ranked[1] - ranked[0]), (ranked[4] + ranked[5]) / 2,
                     ranked[8] + 0.1 * (ranked[9] - ranked[8]))  # positions 0.9, 4.5, 8.1
    assert got["row_p10"][0].item() == pytest.approx(p10, abs=1e-12)
    assert got["row_p50"].tolist() == pytest.approx([p50, 2 * p50]) and p50 == 1.5
    assert got["row_p90"].tolist() == pytest.approx([p90, 2 * p90])
    # top ceil(1.0) = 1 row: 36 of the squares' sum 1 + 4 + ... + 36 = 91 (+ about 1e-12 from the dead rows)
    assert got["top10_share"].tolist() == pytest.approx([36 / 91, 36 / 91], rel=1e-6)


# ---------------------------------------------------------------- the query-key form


def test_top_eigenvalue_against_eigvalsh_including_degenerate_and_zero():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 9, 9, generator=gen, dtype=torch.float64)
    sym = a @ a.mT  # (6, 9, 9) PSD
    assert torch.allclose(top_eigenvalue(sym), torch.linalg.eigvalsh(sym)[..., -1], rtol=1e-10)
    q, _ = torch.linalg.qr(torch.randn(9, 9, generator=gen, dtype=torch.float64))
    twice = q @ torch.diag(torch.tensor([3.0, 3.0, 3.0 - 1e-9, 1, 1, 0.5, 0, 0, 0], dtype=torch.float64)) @ q.T
    assert top_eigenvalue(twice).item() == pytest.approx(3.0, rel=1e-9)  # repeated and near-repeated top
    assert top_eigenvalue(torch.zeros(4, 4)).item() == 0.0
    # a product of two PSD matrices: not symmetric, same eigenvalues as a symmetric one
    b = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    c = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    want = torch.linalg.svdvals(b.T @ c)[0] ** 2
    assert top_eigenvalue((b @ b.T) @ (c @ c.T)).item() == pytest.approx(want.item(), rel=1e-9)


@pytest.mark.parametrize("d_k, d_model", [(4, 12), (12, 12), (20, 6)])
def test_qk_spectral_norm_is_the_largest_singular_value_of_each_heads_form(d_k, d_model):
    gen = torch.Generator().manual_seed(d_k)
    H = 3
    w_q = torch.randn(2, H * d_k, d_model, generator=gen)
    w_k = torch.randn(2, H * d_k, d_model, generator=gen)
    got = qk_spectral_norm(w_q, w_k, H, scale=0.25)  # (2, H)
    for layer in range(2):
        for h in range(H):
            rows = slice(h * d_k, (h + 1) * d_k)
            form = 0.25 * w_q[layer, rows].double().T @ w_k[layer, rows].double()  # (d_model, d_model)
            assert got[layer, h].item() == pytest.approx(torch.linalg.svdvals(form)[0].item(), rel=1e-5)
    with pytest.raises(ValueError, match="n_head"):
        qk_spectral_norm(w_q, w_k, 2 * d_k + 1, scale=1.0)


def test_qk_layernorm_spectral_norm_is_that_of_the_centred_gain_form():
    d_k = 6
    gain_q = torch.tensor([[1.0] * d_k, [1.0, -2.0, 0.5, 3.0, 1.0, 0.0]])
    gain_k = torch.tensor([[1.0] * d_k, [2.0, 1.0, 1.0, -1.0, 0.0, 4.0]])
    got = qk_layernorm_spectral_norm(gain_q, gain_k, scale=0.5)
    assert got[0].item() == pytest.approx(0.5)  # unit gains: the centring projector, top singular value 1
    centre = torch.eye(d_k, dtype=torch.float64) - 1.0 / d_k
    form = centre @ torch.diag((gain_q[1] * gain_k[1]).double()) @ centre
    assert got[1].item() == pytest.approx(0.5 * torch.linalg.svdvals(form)[0].item(), rel=1e-6)


def test_component_std_over_chosen_dims_keeps_the_others():
    t = torch.tensor([[1.0, 3.0], [5.0, 9.0]])  # rows: std 1 and 2; columns: std 2 and 3
    assert component_std(t, dims=-1).tolist() == pytest.approx([1.0, 2.0])
    assert component_std(t, dims=0).tolist() == pytest.approx([2.0, 3.0])


@pytest.mark.parametrize("lead", [(), (2, 3)])
def test_qk_layernorm_spectral_norm_reads_d_k_from_the_last_dim(lead):
    # d_k = 4 gains with 0, 1 or 2 leading dims: unit gains give the centring projector, top singular value 1
    gains = torch.ones(*lead, 4)
    got = qk_layernorm_spectral_norm(gains, gains, scale=2.0)
    assert got.shape == lead and torch.allclose(got, torch.full(lead, 2.0))


@pytest.mark.parametrize("dtype, computed_in", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                (torch.float64, torch.float64)])
def test_jacobian_norm_is_computed_in_float32_at_least(dtype, computed_in):
    # a row of 4 equal entries: ||J||_F = sqrt(1/4 - 1/16), exact in every float format the input can hold
    row = torch.full((1, 4), 0.25, dtype=dtype)
    got = softmax_jacobian_norm(row)
    assert got.dtype == computed_in
    assert got.item() == pytest.approx(math.sqrt(0.25 - 1 / 16), rel=1e-6)


def test_sorted_quantiles_of_empty_rows_are_nan_with_the_leading_shape():
    got = sorted_quantiles(torch.empty(2, 3, 0))
    assert got.shape == (2, 3, 3) and torch.isnan(got).all()


def test_head_stats_of_stacked_layers_are_each_layers_own():
    # (L, B, H, T, T) at once must equal each layer's (B, H, T, T) stats stacked
    torch.manual_seed(0)
    scores = torch.randn(3, 2, 2, 4, 4)
    pattern = torch.softmax(scores.masked_fill(~visible_keys(4, 4, True), -math.inf), -1)
    stacked = head_attention_stats(scores, pattern, causal=True)
    for key, value in stacked.items():
        assert value.shape == (3, 2)
        per_layer = torch.stack([head_attention_stats(scores[i], pattern[i], causal=True)[key] for i in range(3)])
        assert torch.allclose(value, per_layer, equal_nan=True), key


def test_entropy_norm_with_a_single_kept_row():
    # B = 1, causal T = 2: row 0 sees one key (left out), row 1 is uniform over two keys: entropy_norm 1
    pattern = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # (1, 1, 2, 2)
    got = head_attention_stats(torch.zeros(1, 1, 2, 2), pattern, causal=True)["entropy_norm"]
    assert got.item() == pytest.approx(1.0)


def test_normalized_entropy_keeps_the_entropy_precision():
    # log 3 / log 3 in float64: exactly 1 up to float64 rounding (a float32 log would be off by ~1e-8)
    n_visible = torch.tensor([3])
    got = normalized_entropy(torch.tensor([math.log(3)], dtype=torch.float64), n_visible)
    assert got.dtype == torch.float64 and abs(got.item() - 1.0) < 1e-14


def test_masked_std_of_a_single_visible_entry_is_zero():
    scores = torch.tensor([[3.0, -1e9], [2.0, 5.0]])
    visible = torch.tensor([[True, False], [True, True]])
    assert masked_std(scores, visible, -1).tolist() == pytest.approx([0.0, 1.5])


def test_masks_and_empty_quantiles_are_made_on_the_callers_device():
    # the "meta" device stands in for a GPU: a mask made on the default (CPU) device would show here
    meta = torch.device("meta")
    assert visible_keys(3, 3, True, meta).device == meta and visible_keys(3, 3, False, meta).device == meta
    assert visible_count(3, 3, True, meta).device == meta
    assert sorted_quantiles(torch.empty(2, 0, device=meta)).device == meta
    pattern = torch.empty(1, 1, 3, 3, device=meta)
    assert all(v.device == meta for v in head_attention_stats(pattern, pattern, causal=True).values())
