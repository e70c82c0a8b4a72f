"""Reference losses measured from the data itself, so that a model's loss can be read on any corpus.

A model that learned only token frequencies sits at the *unigram* cross-entropy; one that uses only the
previous token (what a model without working attention can still do through its embeddings and MLP) at
about the *bigram* cross-entropy. Both are the held-out targets' mean negative log-likelihood under counts
from the training split:

- unigram, add-one (Laplace) smoothed: p(w) = (c(w) + 1) / (n + V);
- bigram, Witten-Bell interpolated with that unigram: p(w | u) = (c(u, w) + t(u) p(w)) / (c(u) + t(u)),
  where t(u) is the number of distinct tokens seen after u (a context never seen falls back to p(w)).

Witten-Bell rather than add-one for the bigram: add-one spreads V^2 pseudo-counts, which for a BPE
vocabulary of 16k swamps every real count and puts the "bigram" level above the unigram one. Pairs are
counted within training sequences (never across the boundary of two windows), and every held-out target
with a previous token in its window is scored: the same targets as the model's loss.

numpy only: the report and the corpus preparation use it without torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

SMOOTHING = "unigram add-one; bigram Witten-Bell interpolated with the unigram"


@dataclass
class NgramCounts:
    """Unigram and bigram counts of a training split over a vocabulary of `vocab_size` tokens."""

    vocab_size: int
    unigram: np.ndarray  # (V,) int64
    pairs: np.ndarray  # sorted unique pair ids u * V + w, int64
    pair_counts: np.ndarray  # count of each pair id

    @classmethod
    def of(cls, sequences: Iterable[np.ndarray], vocab_size: int) -> NgramCounts:
        """Count tokens and adjacent pairs of each 1-D integer sequence (pairs never cross sequences)."""
        unigram = np.zeros(vocab_size, dtype=np.int64)
        pair_chunks = []
        for seq in sequences:
            seq = np.asarray(seq, dtype=np.int64).reshape(-1)
            unigram += np.bincount(seq, minlength=vocab_size)[:vocab_size]
            if seq.size > 1:
                pair_chunks.append(np.unique(seq[:-1] * vocab_size + seq[1:], return_counts=True))
        if not pair_chunks:
            return cls(vocab_size, unigram, np.zeros(0, np.int64), np.zeros(0, np.int64))
        ids = np.concatenate([p for p, _ in pair_chunks])
        counts = np.concatenate([c for _, c in pair_chunks])
        pairs, inverse = np.unique(ids, return_inverse=True)
        return cls(vocab_size, unigram, pairs, np.bincount(inverse, weights=counts).astype(np.int64))

    def unigram_prob(self) -> np.ndarray:
        """(V,) add-one smoothed unigram probabilities."""
        return (self.unigram + 1.0) / (self.unigram.sum() + self.vocab_size)

    def bigram_prob(self, prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        """Witten-Bell interpolated p(nxt | prev) for aligned 1-D arrays of token ids."""
        V = self.vocab_size
        p_w = self.unigram_prob()[nxt]
        if self.pairs.size == 0:
            return p_w
        contexts = self.pairs // V
        context_total = np.bincount(contexts, weights=self.pair_counts, minlength=V)  # c(u)
        types = np.bincount(contexts, minlength=V).astype(float)  # t(u): distinct successors of u
        ids = prev.astype(np.int64) * V + nxt.astype(np.int64)
        at = np.minimum(np.searchsorted(self.pairs, ids), self.pairs.size - 1)
        c_pair = np.where(self.pairs[at] == ids, self.pair_counts[at], 0).astype(float)  # c(u, w)
        c_ctx, t_ctx = context_total[prev], types[prev]
        seen = c_ctx > 0
        return np.where(seen, (c_pair + t_ctx * p_w) / np.where(seen, c_ctx + t_ctx, 1.0), p_w)


def held_out_references(counts: NgramCounts, windows: np.ndarray) -> dict[str, float]:
    """Unigram and bigram cross-entropy (nats) of the targets windows[:, 1:] of (N, T + 1) held-out windows."""
    windows = np.asarray(windows, dtype=np.int64)
    prev, nxt = windows[:, :-1].reshape(-1), windows[:, 1:].reshape(-1)
    unigram = -np.log(counts.unigram_prob()[nxt]).mean()
    bigram = -np.log(counts.bigram_prob(prev, nxt)).mean()
    return {"unigram": float(unigram), "bigram": float(bigram), "log_vocab": math.log(counts.vocab_size)}


# Training tokens counted for the unigram / bigram references of data=tokens: a corpus larger than this is
# counted on this many tokens in 64 evenly spaced stretches (counts settle long before).
REFERENCE_TOKENS = 1 << 25


def token_file_stretches(ids: np.ndarray, budget: int = REFERENCE_TOKENS, pieces: int = 64) -> list[np.ndarray]:
    """A token file whole when it holds at most `budget` tokens, else `pieces` evenly spaced stretches of it."""
    if ids.size <= budget:
        return [np.asarray(ids)]
    size = budget // pieces
    starts = np.arange(pieces, dtype=np.int64) * (ids.size - size) // (pieces - 1)
    return [np.asarray(ids[s : s + size]) for s in starts]
