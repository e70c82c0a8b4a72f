"""Passes over the training split: tokens seen / training tokens (`data/epochs`).

Every source's training split is finite, the built-in Markov source's too: it is a fixed sample of
`data.train_sequences` sequences drawn once per seed (generating fresh ones each step would cost more than
the step), so the same rule reads every run. Training tokens are the split's windows x T, the target tokens
the batches draw from (`Dataset.train_tokens`). `Dataset.batch` takes a fresh permutation per pass, so a run
sees a window a second time exactly when its tokens seen exceed the training tokens: epochs above 1.
"""

from __future__ import annotations

REPEATS_ABOVE = 1.0  # epochs above this: some training windows were seen more than once


def epochs(tokens_seen: int, train_tokens: int) -> float:
    """Passes over the training split; inf for an empty split."""
    return tokens_seen / train_tokens if train_tokens > 0 else float("inf")


def repeats(value: float | None) -> bool:
    return value is not None and value > REPEATS_ABOVE


def repeat_line(max_steps: int, tokens_per_step: int, train_tokens: int) -> str | None:
    """The one line a run prints at its start when its planned steps pass over the training data more than once,
    with the numbers; None when they do not."""
    planned = epochs(max_steps * tokens_per_step, train_tokens)
    if not repeats(planned):
        return None
    return (f"[andrea-exp] WARNING: this run repeats its training data: {max_steps} steps x {tokens_per_step:,} "
            f"tokens = {max_steps * tokens_per_step:,} tokens over {train_tokens:,} training tokens = "
            f"{planned:.2f} epochs (data/epochs); held-out losses after the first epoch may read memorising as "
            "learning or stalling")
