"""The QK-LayerNorm logit form's norm without its d_k x d_k matrix: against an SVD of the matrix, by hand."""

import math

import pytest
import torch

from andrea_exp.instruments.metrics import centred_diagonal_norm, qk_layernorm_spectral_norm


def reference(g: torch.Tensor) -> float:
    n = g.numel()
    centre = torch.eye(n, dtype=torch.float64) - 1.0 / n
    return float(torch.linalg.svdvals(centre @ torch.diag(g.double()) @ centre).max())


@pytest.mark.parametrize("n", [2, 3, 7, 64, 257])
@pytest.mark.parametrize("kind", ["normal", "positive", "negative", "half_tied", "all_tied"])
def test_matches_the_svd_of_the_matrix(n, kind):
    g = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    g = {"normal": g, "positive": g.abs() + 1, "negative": -g.abs(), "all_tied": torch.full_like(g, 1.3),
         "half_tied": torch.cat([torch.full((n // 2,), 0.7, dtype=torch.float64), g[n // 2:]])}[kind]
    assert centred_diagonal_norm(g).item() == pytest.approx(reference(g), rel=1e-10, abs=1e-12)


def test_by_hand():
    # n = 2: C diag(a, b) C has the eigenvalue (a + b) / 2 on (1, -1) / sqrt(2) and 0 on (1, 1)
    assert centred_diagonal_norm(torch.tensor([1.0, 3.0])).item() == pytest.approx(2.0)
    assert centred_diagonal_norm(torch.tensor([2.0, -2.0])).item() == pytest.approx(0.0, abs=1e-12)
    # equal gains c: C is a projection, so the norm is |c|
    assert centred_diagonal_norm(torch.full((5,), -0.5)).item() == pytest.approx(0.5)
    assert centred_diagonal_norm(torch.tensor([4.0])).item() == 0.0  # C = 0 when d_k = 1


def symmetric_reference(g: torch.Tensor) -> float:
    """The same norm for a larger d_k: C diag(g) C = diag(g) - (g_i + g_j) / n + sum(g) / n^2 is symmetric, so
    its spectral norm is its largest |eigenvalue| (eigvalsh, several times cheaper than an SVD)."""
    g = g.double()
    n = g.numel()
    m = torch.diag(g) - (g[:, None] + g[None, :]) / n + g.sum() / n**2
    return float(torch.linalg.eigvalsh(m).abs().max())


def test_the_symmetric_reference_is_the_svd_one():
    g = torch.randn(33, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert symmetric_reference(g) == pytest.approx(reference(g), rel=1e-12)


def test_batched_and_scaled_like_the_probe():
    g_q, g_k = torch.rand(3, 1024) + 0.5, torch.rand(3, 1024) + 0.5  # (layers, d_k) gains
    got = qk_layernorm_spectral_norm(g_q, g_k, scale=1 / math.sqrt(1024))
    want = [symmetric_reference(g_q[i].double() * g_k[i].double()) / 32 for i in range(3)]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
