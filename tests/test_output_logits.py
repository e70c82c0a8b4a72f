"""The output logits' instruments and z-loss on hand-computed cases: log Z (mean, max) and the largest |logit|
from both loss paths, z-loss's value and gradient against its formula, the logged rows, the setting's rule."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import compose_tiny

from andrea_exp.config.validation import ConfigError, validate
from andrea_exp.model.chunked_loss import OUTPUT_STATS, linear_cross_entropy, linear_cross_entropy_with_stats
from andrea_exp.model.decoder import Andrea, ModelConfig
from andrea_exp.runs import metric_keys as K
from andrea_exp.training.logwindow import LogWindow
from andrea_exp.training.loop import train

# logits x W^T: [1, 0, -3] and [0, 2, 0]
X = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
W = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-3.0, 0.0]], dtype=torch.float64)
T = torch.tensor([0, 2])
LOGZ = (math.log(math.e + 1 + math.exp(-3)), math.log(2 + math.e ** 2))  # by hand, per row


def test_output_stats_of_a_constructed_output_by_hand():
    assert OUTPUT_STATS == ("logz_mean", "logz_max", "logit_absmax", "logz_sq_mean")
    for chunk_rows in (1, 2):  # one chunk per row, or both rows in one
        _, stats = linear_cross_entropy_with_stats(X, W, T, chunk_rows)
        logz_mean, logz_max, absmax, logz_sq = stats.tolist()
        assert logz_mean == pytest.approx(sum(LOGZ) / 2, rel=1e-12)
        assert logz_max == pytest.approx(LOGZ[1], rel=1e-12)  # row 1 has the larger partition function
        assert absmax == 3.0  # the -3 logit: the largest in size, not the largest value (2)
        assert logz_sq == pytest.approx((LOGZ[0] ** 2 + LOGZ[1] ** 2) / 2, rel=1e-12)
    assert not stats.requires_grad


def rows(n=23, d=6, v=11, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(v, d, generator=gen, dtype=torch.float64, requires_grad=True)
    return x, w, torch.randint(0, v, (n,), generator=gen)


@pytest.mark.parametrize("chunk_rows", [1, 5, 23])
def test_z_loss_value_and_gradient_against_its_formula(chunk_rows):
    """loss = mean CE + z * mean logZ^2 (Wortsman et al. 2023); gradients against torch.autograd of the formula."""
    x, w, t = rows()
    z = 0.3  # large, so that a missing or halved term would show
    logits = x @ w.t()
    formula = F.cross_entropy(logits, t) + z * torch.logsumexp(logits, dim=-1).square().mean()
    fx, fw = torch.autograd.grad(formula, (x, w))
    chunked = linear_cross_entropy(x, w, t, chunk_rows, z_loss=z)
    cx, cw = torch.autograd.grad(chunked, (x, w))
    torch.testing.assert_close(chunked, formula, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cx, fx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(cw, fw, rtol=1e-10, atol=1e-12)
    plain_ce = F.cross_entropy(logits, t)
    assert chunked.item() - plain_ce.item() > 0.1  # the term is there


def test_the_z_loss_term_by_hand_on_two_rows():
    ce = ((LOGZ[0] - 1.0) + (LOGZ[1] - 0.0)) / 2  # target logits 1 and 0
    z = 1e-2
    loss = linear_cross_entropy(X, W, T, 1, z_loss=z)
    assert loss.item() == pytest.approx(ce + z * (LOGZ[0] ** 2 + LOGZ[1] ** 2) / 2, rel=1e-12)


TINY_MODEL = dict(vocab_size=13, d_model=16, n_layer=1, n_head=2, d_k=8, d_v=8, block_size=8)


@pytest.mark.parametrize("loss_impl", ["plain", "chunked"])
def test_the_model_keeps_the_training_batchs_output_stats_on_either_loss_path(loss_impl):
    torch.manual_seed(0)
    model = Andrea(ModelConfig(**TINY_MODEL, loss_impl=loss_impl, loss_chunk_rows=5))
    x, y = torch.randint(0, 13, (3, 8)), torch.randint(0, 13, (3, 8))
    model.train()
    _, loss = model(x, y)
    with torch.no_grad():
        logits = model.head(model.hidden(x)).double()  # (B, T, V): the logits, formed apart
    lse = torch.logsumexp(logits, dim=-1)
    expected = [lse.mean(), lse.max(), logits.abs().max(), lse.square().mean()]
    torch.testing.assert_close(model.out_stats.double(), torch.stack(expected), rtol=1e-5, atol=1e-6)
    kept = model.out_stats.clone()
    model.eval()
    model(x[:1], y[:1])  # an evaluation or a probe leaves the training step's stats alone
    assert torch.equal(model.out_stats, kept)


def test_z_loss_is_the_same_on_both_paths_applies_in_training_only_and_trains_the_log_partition_down():
    torch.manual_seed(0)
    plain = Andrea(ModelConfig(**TINY_MODEL, loss_impl="plain"))
    chunked = Andrea(ModelConfig(**TINY_MODEL, loss_impl="chunked", loss_chunk_rows=7))
    chunked.load_state_dict(plain.state_dict())
    x, y = torch.randint(0, 13, (3, 8)), torch.randint(0, 13, (3, 8))
    losses, grads = {}, {}
    for name, model in (("plain", plain), ("chunked", chunked)):
        model.z_loss = 0.5
        _, loss = model(x, y)
        losses[name] = loss
        grads[name] = torch.autograd.grad(loss, [model.head.weight, model.blocks[0].attn.q.weight])
    torch.testing.assert_close(losses["plain"], losses["chunked"], rtol=1e-6, atol=1e-6)
    for a, b in zip(grads["plain"], grads["chunked"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        logits = plain.head(plain.hidden(x)).float()
    by_formula = F.cross_entropy(logits.view(-1, 13), y.reshape(-1)) + 0.5 * torch.logsumexp(logits, -1).square().mean()
    torch.testing.assert_close(losses["plain"], by_formula, rtol=1e-6, atol=1e-6)
    plain.eval()  # evaluation and probes: the cross-entropy alone
    _, eval_loss = plain(x, y)
    torch.testing.assert_close(eval_loss, F.cross_entropy(logits.view(-1, 13), y.reshape(-1)), rtol=1e-6, atol=1e-6)


def test_the_window_logs_the_output_stats_and_the_z_loss_term():
    window = LogWindow(tokens_per_step=10, grad_clip=0.0, z_loss=0.01)
    window.add(0, torch.tensor(2.0), torch.tensor(1.0), 0.1, torch.tensor([3.0, 4.0, 7.5, 10.0]))
    (_, row), = window.flush()
    assert row[K.TRAIN_OUT_LOGZ_MEAN] == 3.0 and row[K.TRAIN_OUT_LOGZ_MAX] == 4.0
    assert row[K.TRAIN_OUT_LOGIT_MAX] == 7.5 and row[K.TRAIN_Z_LOSS] == pytest.approx(0.1)
    off = LogWindow(tokens_per_step=10, grad_clip=0.0)
    off.add(0, torch.tensor(2.0), torch.tensor(1.0), 0.1, torch.tensor([3.0, 4.0, 7.5, 10.0]))
    (_, row), = off.flush()
    assert K.TRAIN_Z_LOSS not in row and row[K.TRAIN_OUT_LOGZ_MEAN] == 3.0
    for key in (K.TRAIN_OUT_LOGZ_MEAN, K.TRAIN_OUT_LOGZ_MAX, K.TRAIN_OUT_LOGIT_MAX, K.TRAIN_Z_LOSS):
        assert key in K.MEANINGS


def test_train_z_loss_must_be_a_finite_number_at_least_0():
    with pytest.raises(ConfigError, match=r"^train.z_loss must be a finite number >= 0; got -0.001$"):
        validate(compose_tiny("train.z_loss=-0.001"))
    validate(compose_tiny("train.z_loss=1e-4"))


def test_every_training_step_logs_the_output_logits_and_z_loss_when_on(tmp_path):
    overrides = ("train.max_steps=3", "train.eval_every=0", "train.log_every=2", "train.device=cpu",
                 "train.sample_tokens=2", "probe.every=0")
    for z_loss in (0.0, 1e-2):
        run_dir = tmp_path / f"z{z_loss}"
        run_dir.mkdir()
        train(validate(compose_tiny(*overrides, f"train.z_loss={z_loss}")), run_dir)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if K.TRAIN_LOSS in r]
        assert [r["step"] for r in steps] == [0, 1, 2]
        for r in steps:
            assert r[K.TRAIN_OUT_LOGZ_MAX] >= r[K.TRAIN_OUT_LOGZ_MEAN] > 0  # log Z >= log V - the logit range
            assert r[K.TRAIN_OUT_LOGIT_MAX] > 0
            assert (K.TRAIN_Z_LOSS in r) == (z_loss > 0)
            if z_loss:  # log Z^2 >= (mean log Z)^2: the term is at least z * mean^2
                assert r[K.TRAIN_Z_LOSS] >= z_loss * r[K.TRAIN_OUT_LOGZ_MEAN] ** 2 * (1 - 1e-6)


def test_without_z_loss_asked_for_the_loss_is_the_plain_cross_entropy():
    loss, _ = linear_cross_entropy_with_stats(X, W, T)  # no z_loss given: none
    assert loss.item() == pytest.approx(((LOGZ[0] - 1.0) + (LOGZ[1] - 0.0)) / 2, rel=1e-12)


def test_a_compiled_model_adds_the_z_loss_term_too(monkeypatch):
    """Inside a model being compiled the loss takes its own path (chunked_loss._outside_the_graph); z-loss goes
    along. Shown without compiling: the compiler is said to be tracing, and the chunk step is the plain one."""
    from andrea_exp.model import chunked_loss

    z = 1e-2
    eager = linear_cross_entropy(X, W, T, 1, z_loss=z)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(chunked_loss, "compiled_chunk_step", lambda: chunked_loss.chunk_step)
    assert linear_cross_entropy(X, W, T, 1, z_loss=z).item() == pytest.approx(eager.item(), rel=1e-12)
    assert eager.item() == pytest.approx(((LOGZ[0] - 1.0) + LOGZ[1]) / 2 + z * (LOGZ[0] ** 2 + LOGZ[1] ** 2) / 2)
