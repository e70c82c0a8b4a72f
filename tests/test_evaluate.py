"""Held-out loss as trained vs at generation time, checked against a plain loop over prefixes."""

import math

import pytest
import torch
import torch.nn.functional as F

from andrea_exp.evaluate import evaluate, generate, loss_as_trained, loss_generation
from andrea_exp.model import Andrea, ModelConfig


def small_model(causal: bool) -> Andrea:
    torch.manual_seed(0)
    # unscaled scores make attention sharp, so reading the future changes the loss visibly
    model = Andrea(ModelConfig(vocab_size=12, block_size=16, d_model=32, n_layer=2, n_head=2, d_k=8, d_v=8,
                               causal=causal, scale="none"))
    return model.eval()


def held_out(n=5, T=9, vocab=12):
    return torch.randint(0, vocab, (n, T + 1), generator=torch.Generator().manual_seed(7))


@torch.no_grad()
def prefix_loop_loss(model, tokens) -> float:
    """Each target scored from a forward over exactly the tokens before it, one sequence at a time."""
    nlls = []
    for seq in tokens:
        for i in range(seq.numel() - 1):
            logits, _ = model(seq[: i + 1].unsqueeze(0))  # (1, i+1, V)
            nlls.append(-F.log_softmax(logits[0, -1].double(), dim=-1)[seq[i + 1]].item())
    return sum(nlls) / len(nlls)


def test_causal_model_generation_loss_equals_as_trained_and_the_prefix_loop():
    model, tokens = small_model(causal=True), held_out()
    as_trained = loss_as_trained(model, tokens)
    assert loss_generation(model, tokens) == pytest.approx(as_trained, abs=1e-5)
    assert prefix_loop_loss(model, tokens) == pytest.approx(as_trained, abs=1e-5)  # the mask really hides j > i


def test_non_causal_generation_loss_equals_the_prefix_loop_and_not_the_teacher_forced_loss():
    model, tokens = small_model(causal=False), held_out()
    generation = loss_generation(model, tokens, batch_size=2)  # uneven last batch on purpose
    assert generation == pytest.approx(prefix_loop_loss(model, tokens), abs=1e-5)
    assert abs(generation - loss_as_trained(model, tokens)) > 1e-3  # the full-context pass sees the future


def test_as_trained_loss_does_not_depend_on_the_batch_split():
    model, tokens = small_model(causal=True), held_out(n=7)
    _, whole = model(tokens[:, :-1], tokens[:, 1:])
    assert loss_as_trained(model, tokens, batch_size=3) == pytest.approx(whole.item(), abs=1e-6)


def test_evaluate_reports_gap_and_floor_and_restores_mode():
    model, tokens = small_model(causal=False), held_out()
    model.train()
    got = evaluate(model, tokens, floor=1.25)
    assert model.training
    assert got["eval/gap"] == pytest.approx(got["eval/loss_generation"] - got["eval/loss_as_trained"])
    assert got["eval/floor"] == 1.25
    assert got["eval/below_floor"] == pytest.approx(1.25 - got["eval/loss_as_trained"])
    no_floor = evaluate(small_model(causal=True), tokens, floor=math.nan)
    assert "eval/floor" not in no_floor and "eval/below_floor" not in no_floor
    assert no_floor["eval/gap"] == 0.0


def test_generate_samples_one_full_forward_per_token():
    model = small_model(causal=False)
    prompt = held_out(n=1)[:, :4]
    out = generate(model, prompt, n_tokens=6, seed=3)
    assert out.shape == (1, 10) and torch.equal(out[:, :4], prompt)
    assert torch.equal(out, generate(model, prompt, n_tokens=6, seed=3))
    # the same draws, written out: full context each time (a non-causal model has no valid cache)
    gen = torch.Generator().manual_seed(3)
    seq = prompt
    with torch.no_grad():
        for _ in range(6):
            probs = torch.softmax(model(seq)[0][:, -1].float(), dim=-1)
            seq = torch.cat([seq, torch.multinomial(probs, 1, generator=gen)], dim=1)
    assert torch.equal(out, seq)
