"""The metric functions on cases worked out by hand."""

import math

import pytest
import torch

from andrea_exp.attention import attention, explicit_attention
from andrea_exp.metrics import (
    component_std,
    global_norm,
    head_attention_stats,
    masked_max,
    masked_std,
    normalized_entropy,
    row_entropy,
    row_max_prob,
    saturated_rows,
    visible_count,
    visible_keys,
)


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
