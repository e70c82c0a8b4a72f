"""Logit soft-capping and sigma-reparam on hand-computed cases: the cap's values and its refusals, sigma against
the exact spectral norm (torch.linalg.matrix_norm, ord=2), the reparametrised layer's start and its scale
invariance, and every attention path taking it."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import compose_tiny

from andrea_exp.config import variants
from andrea_exp.config.schema import ModelSchema
from andrea_exp.config.validation import ConfigError, validate
from andrea_exp.model.decoder import Andrea
from andrea_exp.model.sigma_reparam import SigmaReparam, reparametrize

TINY = dict(vocab_size=12, d_model=16, n_layer=1, n_head=2, d_k=8, d_v=8, block_size=16)

# ---------------------------------------------------------------- soft-capping


def test_soft_cap_values_by_hand():
    cap = variants.SCORE_TRANSFORMS["logit_softcap"]
    s = torch.tensor([0.0, 1.0, -1.0, 100.0, -100.0], dtype=torch.float64)
    expected = [0.0, 2 * math.tanh(0.5), -2 * math.tanh(0.5), 2.0, -2.0]
    assert cap(s, 2.0).tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    small = torch.tensor([1e-3], dtype=torch.float64)
    assert cap(small, 50.0).item() == pytest.approx(1e-3, rel=1e-9)  # about s well below the cap


def test_the_model_caps_its_attention_logits_and_takes_the_explicit_path():
    torch.manual_seed(0)
    model = Andrea(ModelSchema(**TINY, logit_softcap=0.5, qk_init="unit", scale="none"))
    assert model.blocks[0].attn.impl == "explicit"  # auto leaves the fused kernels out
    attn = model.blocks[0].attn
    attn.stages = {}
    model(torch.randint(0, 12, (2, 9)))
    scores = attn.stages["scores"]
    assert scores.masked_fill(torch.isinf(scores), 0).abs().max() <= 0.5
    bilinear = Andrea(ModelSchema(**{**TINY, "d_k": 64}, logit_softcap=0.5, scale="none"))
    assert bilinear.blocks[0].attn.impl == "bilinear"  # d_k > d_model: the bilinear form takes a transform too


@pytest.mark.parametrize("override,message", [
    ("model.logit_softcap=0", "model.logit_softcap must be a finite number > 0; got 0.0"),
    ("model.logit_softcap=-5", "model.logit_softcap must be a finite number > 0; got -5.0"),
])
def test_bad_values_are_refused_in_one_line(override, message):
    with pytest.raises(ConfigError, match=f"^{message}$"):
        validate(compose_tiny(override))
    key, value = override.removeprefix("model.").split("=")
    with pytest.raises(ConfigError, match=f"^{message}$"):  # a direct caller of the model's settings too
        ModelSchema(**TINY, **{key: float(value)})
    with pytest.raises(ConfigError, match="^model.sigma_reparam must be one of true, false; got 'maybe'$"):
        ModelSchema(**TINY, sigma_reparam="maybe")


def test_soft_capping_is_refused_where_a_path_cannot_apply_it():
    with pytest.raises(ConfigError, match="^model.attn_impl=fused cannot apply logit_softcap to the scores"):
        validate(compose_tiny("model.logit_softcap=30", "model.attn_impl=fused"))
    with pytest.raises(ConfigError, match="^train.attn_stats=every reads q and k alone, without logit_softcap"):
        validate(compose_tiny("model.logit_softcap=30", "train.attn_stats=every"))
    validate(compose_tiny("model.logit_softcap=30"))


# ---------------------------------------------------------------- sigma-reparam


def spread_matrix(out=12, inp=7, seed=0, top=5.0):
    """A weight with a well separated top singular value (top, then <= 1), so power iteration converges fast."""
    g = torch.Generator().manual_seed(seed)
    u, _ = torch.linalg.qr(torch.randn(out, inp, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(inp, inp, generator=g, dtype=torch.float64))
    s = torch.linspace(1.0, 0.1, inp, dtype=torch.float64)
    s[0] = top
    return (u * s) @ v.T


def test_sigma_matches_the_exact_spectral_norm_at_the_start_and_follows_the_weight():
    w = torch.randn(24, 9, generator=torch.Generator().manual_seed(1))
    reparam = SigmaReparam(w)
    exact = torch.linalg.matrix_norm(w.double(), ord=2).item()
    assert reparam.sigma(w).item() == pytest.approx(exact, rel=1e-5)  # from the SVD: exact at the start
    assert reparam.gamma.item() == pytest.approx(exact, rel=1e-6)
    torch.testing.assert_close(reparam(w), w, rtol=1e-5, atol=1e-6)  # the layer starts as the plain one
    moved = spread_matrix().float()  # a new weight: power iteration finds its sigma over training forwards
    reparam = SigmaReparam(torch.randn(12, 7))
    for _ in range(30):
        sigma = reparam.sigma(moved)
    assert sigma.item() == pytest.approx(torch.linalg.matrix_norm(moved.double(), ord=2).item(), rel=1e-5)


def test_u_moves_only_in_training_mode_and_sigma_is_differentiated_through_the_weight_alone():
    w = spread_matrix().float().requires_grad_(True)
    reparam = SigmaReparam(torch.randn(12, 7))
    reparam.eval()
    before = reparam.u.clone()
    reparam.sigma(w)
    assert torch.equal(reparam.u, before)
    reparam.train()
    for _ in range(30):
        reparam.sigma(w.detach())
    sigma = reparam.sigma(w)
    (grad,) = torch.autograd.grad(sigma, w)
    # d sigma / d W = v u^T for the top singular pair (u, v held): the outer product of the singular vectors
    u_svd, _, vh = torch.linalg.svd(w.detach().double())
    expected = torch.outer(u_svd[:, 0], vh[0]).float()
    torch.testing.assert_close(grad.abs(), expected.abs(), rtol=1e-3, atol=1e-4)


def test_the_reparametrised_weight_does_not_grow_with_the_stored_weight():
    """W_hat = gamma / sigma(W) * W: scaling W by 10 leaves W_hat as it was: only gamma sets the spectral norm."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(7, 12, bias=False)
    reparametrize(linear)
    start = linear.weight.detach().clone()
    with torch.no_grad():
        linear.parametrizations.weight.original.mul_(10.0)
    torch.testing.assert_close(linear.weight, start, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        linear.parametrizations.weight[0].gamma.mul_(2.0)
    assert torch.linalg.matrix_norm(linear.weight.double(), ord=2).item() == pytest.approx(
        2.0 * torch.linalg.matrix_norm(start.double(), ord=2).item(), rel=1e-4)


@pytest.mark.parametrize("attn_impl", ["fused", "explicit", "bilinear"])
def test_every_attention_path_takes_sigma_reparam_and_starts_as_the_plain_model(attn_impl):
    torch.manual_seed(0)
    spec = dict(TINY, attn_impl=attn_impl)
    plain = Andrea(ModelSchema(**spec))
    torch.manual_seed(0)
    model = Andrea(ModelSchema(**spec, sigma_reparam=True))
    names = {n for n, _ in model.named_parameters()}
    assert "blocks.0.attn.q.parametrizations.weight.original" in names
    assert "blocks.0.attn.k.parametrizations.weight.0.gamma" in names
    x, y = torch.randint(0, 12, (2, 9)), torch.randint(0, 12, (2, 9))
    _, plain_loss = plain(x, y)
    _, loss = model(x, y)
    assert loss.item() == pytest.approx(plain_loss.item(), rel=1e-5)  # gamma = sigma at the start: same model
    loss.backward()
    gamma = model.blocks[0].attn.q.parametrizations.weight[0].gamma
    assert gamma.grad is not None and gamma.grad.abs() > 0  # gamma learns
    decayed = {id(p) for p in model.param_groups(0.1)[0]["params"]}
    assert id(gamma) not in decayed  # a scalar gain: not weight-decayed


def test_sigma_reparam_is_refused_nowhere():
    for override in ("model.attn_impl=fused", "model.attn_impl=bilinear", "train.attn_stats=every"):
        validate(compose_tiny("model.sigma_reparam=true", override))
