"""Held-out loss as trained vs at generation time, checked against a plain loop over prefixes."""

import math

import pytest
import torch
import torch.nn.functional as F

from andrea_exp.instruments.evaluate import (
    GENERATION_MAX_TOKENS,
    evaluate,
    generate,
    generation_max_tokens,
    loss_as_trained,
    loss_generation,
    prefix_groups,
)
from andrea_exp.model.decoder import Andrea, ModelConfig


def small_model(causal: bool, **overrides) -> Andrea:
    torch.manual_seed(0)
    # unscaled scores make attention sharp, so reading the future changes the loss visibly
    model = Andrea(ModelConfig(vocab_size=12, block_size=16, d_model=32, n_layer=2, n_head=2, d_k=8, d_v=8,
                               causal=causal, scale="none", **overrides))
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


def test_the_mask_is_read_from_the_layers():
    """Generation reads the layers' own mask, not a setting beside them: layers that hide the future give one pass."""
    import dataclasses

    model, tokens = small_model(causal=True), held_out()
    model.cfg = dataclasses.replace(model.cfg, causal=False)  # a stale setting: every layer still masks the future
    metrics = evaluate(model, tokens, floor=math.nan)
    assert metrics["eval/gap"] == 0.0 and metrics["eval/loss_generation"] == metrics["eval/loss_as_trained"]


def test_non_causal_generation_loss_equals_the_prefix_loop_and_not_the_teacher_forced_loss():
    model, tokens = small_model(causal=False), held_out()
    generation = loss_generation(model, tokens, batch_size=2)  # uneven last batch on purpose
    assert generation == pytest.approx(prefix_loop_loss(model, tokens), abs=1e-5)
    assert abs(generation - loss_as_trained(model, tokens)) > 1e-3  # the full-context pass sees the future


@torch.no_grad()
def per_prefix_loss(model, tokens, batch_size: int) -> float:
    """The algorithm loss_generation batches: one forward per prefix length over a batch of sequences."""
    total, T = 0.0, tokens.size(1) - 1
    for rows in tokens.split(batch_size):
        for i in range(T):
            logits, _ = model(rows[:, : i + 1])  # (b, i+1, V): the prefix 0..i, nothing after it
            total += F.cross_entropy(logits[:, -1].float(), rows[:, i + 1], reduction="sum").item()
    return total / (tokens.size(0) * T)


@pytest.mark.parametrize("attn_impl", ["explicit", "fused", "bilinear"])
def test_batched_prefixes_equal_one_forward_per_prefix(attn_impl):
    """Several runs of prefix lengths per batch (max_tokens 40), of uneven sizes that do not divide T 13,
    over batches of 2 and 1 sequences: the same loss as T forwards per batch."""
    model, tokens = small_model(causal=False, attn_impl=attn_impl), held_out(n=5, T=13)
    groups = prefix_groups(13, 2, max_tokens=40)
    assert len(groups) > 3 and any(13 % (hi - lo + 1) for lo, hi in groups[:-1])
    reference = per_prefix_loss(model, tokens, batch_size=2)
    assert loss_generation(model, tokens, batch_size=2, max_tokens=40) == pytest.approx(reference, abs=1e-5)
    assert loss_generation(model, tokens, batch_size=2, max_tokens=1) == pytest.approx(reference, abs=1e-5)
    assert loss_generation(model, tokens, max_tokens=10**6) == pytest.approx(reference, abs=1e-5)  # one forward
    assert loss_generation(model, tokens) == pytest.approx(reference, abs=1e-5)  # the CPU's default: per prefix


@pytest.mark.parametrize("T,rows,max_tokens", [(13, 2, 40), (13, 1, 40), (9, 5, 1), (128, 64, 65536), (128, 64, 10**9)])
def test_prefix_groups_cover_every_length_once_within_the_budget(T, rows, max_tokens):
    groups = prefix_groups(T, rows, max_tokens)
    assert [p for lo, hi in groups for p in range(lo, hi + 1)] == list(range(1, T + 1))
    for lo, hi in groups:
        assert lo <= hi
        assert rows * (hi - lo + 1) * hi <= max_tokens or lo == hi  # a single length may exceed it
    if max_tokens == 65536:
        assert len(groups) == 10  # the default at T 128, 64 sequences: 10 forwards instead of 128
    if max_tokens == 10**9:
        assert groups == [(1, T)]


@pytest.mark.parametrize("attn_impl", ["explicit", "fused"])
def test_batched_prefixes_under_bf16_autocast(attn_impl):
    """As evaluate_into runs it on a GPU: bf16 scores take the -inf of absent keys, the head the float32
    hidden states. Same GEMMs in bf16 as the per-prefix loop, other shapes: 3e-8 apart here, 1e-3 allowed."""
    model, tokens = small_model(causal=False, attn_impl=attn_impl), held_out(n=3, T=11)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = per_prefix_loss(model, tokens, batch_size=3)
        batched = loss_generation(model, tokens, max_tokens=60)
    assert len(prefix_groups(11, 3, 60)) > 2
    assert math.isfinite(batched) and batched == pytest.approx(reference, abs=1e-3)


def test_prefixes_are_batched_on_accelerators_only():
    assert generation_max_tokens(torch.device("cpu")) == 0 and prefix_groups(9, 4, 0) == [(p, p) for p in range(1, 10)]
    assert generation_max_tokens(torch.device("cuda", 0)) == generation_max_tokens("meta") == GENERATION_MAX_TOKENS


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


def test_generation_on_fewer_windows_pairs_the_gap_with_the_same_windows():
    model, tokens = small_model(causal=False), held_out(n=6)
    got = evaluate(model, tokens, floor=math.nan, generation_sequences=2)
    assert got["eval/loss_generation"] == pytest.approx(loss_generation(model, tokens[:2]), abs=1e-6)
    assert got["eval/loss_generation"] != pytest.approx(loss_generation(model, tokens), abs=1e-4)
    first_two = loss_as_trained(model, tokens[:2])
    assert got["eval/gap"] == pytest.approx(got["eval/loss_generation"] - first_two, abs=1e-6)
    assert got["eval/loss_as_trained"] == pytest.approx(loss_as_trained(model, tokens), abs=1e-6)  # all windows
    assert evaluate(model, tokens, floor=math.nan, generation_sequences=50) == evaluate(model, tokens, math.nan)


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


def test_loops_over_changing_lengths_leave_cudnn_attention_out(monkeypatch):
    """cuDNN's attention plans every new shape anew: generation and the prefix-batched generation loss run without
    it; the fixed-shape teacher-forced loss keeps PyTorch's full choice."""
    import andrea_exp.model.attention as attention

    seen = []
    real = attention.F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", recording)
    model = small_model(causal=False, attn_impl="fused")
    tokens = held_out()
    loss_as_trained(model, tokens)
    assert seen and all(seen)
    seen.clear()
    loss_generation(model, tokens)
    generate(model, tokens[:1, :3], 4)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored afterwards
