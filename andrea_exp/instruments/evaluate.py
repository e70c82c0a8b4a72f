"""Held-out loss as trained, loss at generation time, and a generated sample."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from andrea_exp.model.attention import varying_shape_context
from andrea_exp.runs import metric_keys as K

# Logit elements (rows x T x V) alive at once while per-sequence losses are computed.
ROW_LOSS_LOGITS = 1 << 24


@torch.no_grad()
def sequence_losses(model, tokens: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """(N,) float64 teacher-forced mean cross-entropy of each held-out sequence (N, T+1), own mask.

    The logits are formed a few sequences at a time (ROW_LOSS_LOGITS elements), never (N, T, V) at once."""
    T = tokens.size(1) - 1
    out = []
    for rows in tokens.split(batch_size):
        h = model.hidden(rows[:, :-1])  # (b, T, d_model)
        first, per_chunk = 0, 1  # one sequence first: the width V of its logits sizes the later head calls
        while first < len(rows):
            logits = model.head(h[first : first + per_chunk])  # (c, T, V)
            logits = logits if logits.dtype == torch.float64 else logits.float()
            nll = F.cross_entropy(logits.transpose(1, 2), rows[first : first + per_chunk, 1:], reduction="none")
            out.append(nll.double().mean(dim=1))  # (c,)
            first += per_chunk
            per_chunk = max(1, ROW_LOSS_LOGITS // (T * logits.size(-1)))
    return torch.cat(out)


def sees_only_its_prefix(model) -> bool:
    """Whether every attention layer of `model` masks the future: then position i already sees only tokens 0..i."""
    return all(block.attn.causal for block in model.blocks)


def loss_as_trained(model, tokens: torch.Tensor, batch_size: int = 64) -> float:
    """Teacher-forced mean cross-entropy on (N, T+1) held-out tokens with the model's own mask."""
    return sequence_losses(model, tokens, batch_size).mean().item()


def mean_and_standard_error(per_sequence: torch.Tensor) -> tuple[float, float]:
    """Mean of per-sequence losses and its standard error over sequences (nan for fewer than 2): tokens of
    one window are correlated, windows far less, so the window is the unit of the error."""
    values = per_sequence.double().cpu()
    se = float(values.std(unbiased=True) / math.sqrt(values.numel())) if values.numel() > 1 else math.nan
    return float(values.mean()), se


# Tokens (rows x length) in one forward of loss_generation on an accelerator; memory per forward grows
# with it. q and k hold n_head * d_k elements per token each (d_k 4096, 4 heads: 2 GiB apiece in bf16 at
# 65536 tokens), the explicit path's scores rows x n_head x length^2 = tokens x n_head x length elements
# (32 Mi at length 128). At 65536, T 128 and 64 sequences take 10 forwards instead of 128, 12% of the
# tokens padding.
GENERATION_MAX_TOKENS = 65536


def generation_max_tokens(device: torch.device) -> int:
    """loss_generation's default budget on `device`. Batching prefixes saves kernel launches, which only an
    accelerator waits on: on the CPU, where bigger tensors also fall out of cache, it was 1.2-3x slower
    than one forward per prefix (andrea_tiny, 2 cores), so the CPU gets 0: one prefix length per forward."""
    return 0 if torch.device(device).type == "cpu" else GENERATION_MAX_TOKENS


def prefix_groups(T: int, rows: int, max_tokens: int = GENERATION_MAX_TOKENS) -> list[tuple[int, int]]:
    """Prefix lengths 1..T cut into runs lo..hi (inclusive) of consecutive lengths, each run as long as
    rows x (hi - lo + 1) copies of hi tokens fit in max_tokens (at least one length per run)."""
    groups, lo = [], 1
    while lo <= T:
        n = 1
        while lo + n <= T and rows * (n + 1) * (lo + n) <= max_tokens:
            n += 1
        groups.append((lo, lo + n - 1))
        lo += n
    return groups


@torch.no_grad()
def loss_generation(model, tokens: torch.Tensor, batch_size: int = 64, max_tokens: int | None = None) -> float:
    """Mean cross-entropy when position i sees only tokens 0..i, as it does while generating.

    A causal model already sees only its prefix, so one pass gives the answer. A model trained
    without the mask attends to every position it is given, so target p (p = 1..T) must be scored
    from a forward over exactly tokens 0..p-1 (and a KV cache would be wrong: earlier positions'
    states change as the prefix grows).

    Those T forwards are batched: for a run of prefix lengths lo..hi (see prefix_groups), each sequence
    is cut to its first hi tokens and repeated once per length p, and the copy for p gets
    visible_keys = p: every attention layer gives keys j >= p weight exactly 0 (-inf scores), as if
    they were not there. Everything else in the model is per token (embeddings of the same positions,
    LayerNorm, MLP), so positions < p compute what the forward over tokens 0..p-1 computes, and the
    logits at p-1 score target p. Positions >= p still see keys < p (no empty rows) and are ignored.
    Only the hidden states at p-1 go through the head: the (rows, hi, V) logits are never formed.
    max_tokens bounds rows x hi per forward (None: generation_max_tokens of the tokens' device; a run
    holds at least one length, so 0 gives one forward per prefix length); one host sync at the end.
    """
    if sees_only_its_prefix(model):
        return loss_as_trained(model, tokens, batch_size)
    total = torch.zeros((), dtype=torch.float64, device=tokens.device)  # summed on the device: one host sync
    T = tokens.size(1) - 1
    max_tokens = generation_max_tokens(tokens.device) if max_tokens is None else max_tokens
    with varying_shape_context():  # a new prefix length per forward
        for rows in tokens.split(batch_size):
            b = rows.size(0)
            for lo, hi in prefix_groups(T, b, max_tokens):
                lengths = torch.arange(lo, hi + 1, device=tokens.device)  # (n,) the run's prefix lengths
                n = lengths.numel()
                x = rows[:, :hi].repeat_interleave(n, dim=0)  # (b*n, hi): sequence s in rows s*n .. s*n+n-1
                visible = lengths.repeat(b)  # (b*n,): row s*n+j keeps keys < lengths[j]
                h = model.hidden(x, visible_keys=visible if n > 1 else None)  # (b*n, hi, d_model); n 1: none absent
                last = h[torch.arange(b * n, device=tokens.device), visible - 1]  # (b*n, d_model): position p-1
                logits = model.head(last)  # (b*n, V)
                targets = rows[:, lo:hi + 1].reshape(-1)  # (b*n,): token p follows the prefix 0..p-1
                total += F.cross_entropy(logits.float(), targets, reduction="sum")
    return total.item() / (tokens.size(0) * T)


@torch.no_grad()
def generate(model, prompt: torch.Tensor, n_tokens: int, seed: int = 0) -> torch.Tensor:
    """Sample n_tokens after prompt (1, t), one full forward per token, as deployment would."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    seq = prompt
    block = model.cfg.block_size
    with varying_shape_context():  # one token longer every forward
        for _ in range(n_tokens):
            logits, _ = model(seq[:, -block:])
            probs = torch.softmax(logits[:, -1].float(), dim=-1).cpu()
            nxt = torch.multinomial(probs, 1, generator=gen).to(seq.device)
            seq = torch.cat([seq, nxt], dim=1)
    return seq


def evaluate(model, held_out, floor: float, floor_se: float = math.nan,
             generation_sequences: int | None = None, held_in: torch.Tensor | None = None) -> dict:
    """The eval/* metrics of the contract on held-out (N, T+1) tokens already on the model's device.

    floor: the exact entropy of the held-out targets (nan when unknown); floor_se: its sampling standard error.
    generation_sequences: score the generation loss of an unmasked model on the first n held-out windows
    only (None: all N). It costs about T/2 forwards of a window per window (a forward per prefix length),
    which at T 1024 outweighs the training between evaluations; the gap is then paired, the generation
    loss minus the as-trained loss of the same n windows, so it stays unbiased.
    held_in: fixed training windows (N', T+1); their loss with the model's own mask is eval/loss_train_split,
    the training loss beside the held-out one (a held-out loss that rises while it falls is memorising).
    """
    was_training = model.training
    model.eval()
    per_sequence = sequence_losses(model, held_out)  # (N,)
    as_trained, as_trained_se = mean_and_standard_error(per_sequence)
    if sees_only_its_prefix(model):
        generation, gap = as_trained, 0.0
    else:
        n = held_out.size(0) if generation_sequences is None else min(generation_sequences, held_out.size(0))
        generation = loss_generation(model, held_out[:n])
        gap = generation - float(per_sequence[:n].double().mean())
    train_split = None if held_in is None else sequence_losses(model, held_in).mean().item()
    model.train(was_training)
    metrics = {K.EVAL_LOSS_AS_TRAINED: as_trained, K.EVAL_LOSS_GENERATION: generation,
               K.EVAL_GAP: gap, K.EVAL_LOSS_SE: as_trained_se}
    if train_split is not None:
        metrics[K.EVAL_LOSS_TRAIN_SPLIT] = train_split
    if not math.isnan(floor):
        metrics[K.EVAL_FLOOR] = floor
        metrics[K.EVAL_BELOW_FLOOR] = floor - as_trained
        if not math.isnan(floor_se):
            metrics[K.EVAL_FLOOR_SE] = floor_se
    return metrics
