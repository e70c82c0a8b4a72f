"""Held-out loss as trained, loss at generation time, and a generated sample."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from andrea_exp import metric_keys as K


@torch.no_grad()
def loss_as_trained(model, tokens: torch.Tensor, batch_size: int = 64) -> float:
    """Teacher-forced mean cross-entropy on (N, T+1) held-out tokens with the model's own mask."""
    total = torch.zeros((), dtype=torch.float64, device=tokens.device)  # summed on the device: one host sync
    for rows in tokens.split(batch_size):
        _, loss = model(rows[:, :-1], rows[:, 1:])
        total += loss.double() * rows[:, 1:].numel()
    return total.item() / tokens[:, 1:].numel()


@torch.no_grad()
def loss_generation(model, tokens: torch.Tensor, batch_size: int = 64) -> float:
    """Mean cross-entropy when position i sees only tokens 0..i, as it does while generating.

    A causal model already sees only its prefix, so one pass gives the answer. A model trained
    without the mask attends to every position it is given, so each prefix needs its own forward
    (and a KV cache would be wrong: earlier positions' states change as the prefix grows).
    """
    if model.cfg.causal:
        return loss_as_trained(model, tokens, batch_size)
    total = torch.zeros((), dtype=torch.float64, device=tokens.device)  # summed on the device: one host sync
    T = tokens.size(1) - 1
    for rows in tokens.split(batch_size):
        for i in range(T):
            logits, _ = model(rows[:, : i + 1])  # (b, i+1, V): the prefix 0..i, nothing after it
            total += F.cross_entropy(logits[:, -1].float(), rows[:, i + 1], reduction="sum")
    return total.item() / (tokens.size(0) * T)


@torch.no_grad()
def generate(model, prompt: torch.Tensor, n_tokens: int, seed: int = 0) -> torch.Tensor:
    """Sample n_tokens after prompt (1, t), one full forward per token, as deployment would."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    seq = prompt
    block = model.cfg.block_size
    for _ in range(n_tokens):
        logits, _ = model(seq[:, -block:])
        probs = torch.softmax(logits[:, -1].float(), dim=-1).cpu()
        nxt = torch.multinomial(probs, 1, generator=gen).to(seq.device)
        seq = torch.cat([seq, nxt], dim=1)
    return seq


def evaluate(model, held_out, floor: float, floor_se: float = math.nan) -> dict:
    """The eval/* metrics of the contract on held-out (N, T+1) tokens already on the model's device.

    floor: the exact entropy of the held-out targets (nan when unknown); floor_se: its sampling standard error.
    """
    was_training = model.training
    model.eval()
    as_trained = loss_as_trained(model, held_out)
    if model.cfg.causal:
        generation = as_trained
    else:
        generation = loss_generation(model, held_out)
    model.train(was_training)
    metrics = {K.EVAL_LOSS_AS_TRAINED: as_trained, K.EVAL_LOSS_GENERATION: generation,
               K.EVAL_GAP: generation - as_trained}
    if not math.isnan(floor):
        metrics[K.EVAL_FLOOR] = floor
        metrics[K.EVAL_BELOW_FLOOR] = floor - as_trained
        if not math.isnan(floor_se):
            metrics[K.EVAL_FLOOR_SE] = floor_se
    return metrics
