"""The data's reference losses (unigram, bigram) by hand, and as every run records them."""

import math

import numpy as np
import pytest
from conftest import data_settings

from andrea_exp.data.references import NgramCounts, held_out_references
from andrea_exp.data.sources import build_dataset, token_file_stretches


def test_counts_and_probabilities_by_hand():
    # V 4, training 0 1 0 1 0 1: unigram (3+1)/(6+4) = 0.4 for 0 and 1, 1/10 for 2 and 3
    counts = NgramCounts.of([np.array([0, 1, 0, 1, 0, 1])], vocab_size=4)
    assert counts.unigram.tolist() == [3, 3, 0, 0]
    assert counts.unigram_prob() == pytest.approx([0.4, 0.4, 0.1, 0.1])
    # 0 -> 1 three times (one successor type): (3 + 1 * 0.4) / (3 + 1); 1 -> 0 twice: (2 + 0.4) / 3;
    # 1 -> 1 never seen after 1: (0 + 1 * 0.4) / 3; context 2 never seen: the unigram 0.1
    p = counts.bigram_prob(np.array([0, 1, 1, 2]), np.array([1, 0, 1, 3]))
    assert p == pytest.approx([0.85, 0.8, 0.4 / 3, 0.1])


def test_bigram_probabilities_sum_to_one_for_every_context():
    rng = np.random.default_rng(0)
    counts = NgramCounts.of([rng.integers(0, 7, 300), rng.integers(0, 7, 50)], vocab_size=9)
    for u in range(9):
        row = counts.bigram_prob(np.full(9, u), np.arange(9))
        assert row.sum() == pytest.approx(1.0)


def test_pairs_never_cross_two_sequences():
    joined = NgramCounts.of([np.array([0, 1, 2, 3])], vocab_size=4)
    apart = NgramCounts.of([np.array([0, 1]), np.array([2, 3])], vocab_size=4)
    assert joined.pairs.size == 3 and apart.pairs.size == 2  # 1 -> 2 exists only when joined


def test_references_of_held_out_windows():
    counts = NgramCounts.of([np.array([0, 1, 0, 1, 0, 1])], vocab_size=4)
    refs = held_out_references(counts, np.array([[0, 1, 0], [1, 0, 1]]))
    # targets 1 0 (after 0 1) and 0 1 (after 1 0): unigram 0.4 each; bigram 0.85 for 0->1, 0.8 for 1->0
    assert refs["unigram"] == pytest.approx(-math.log(0.4))
    assert refs["bigram"] == pytest.approx(-(2 * math.log(0.85) + 2 * math.log(0.8)) / 4)
    assert refs["log_vocab"] == pytest.approx(math.log(4))


def test_a_deterministic_text_has_a_bigram_level_near_zero_and_a_unigram_level_near_log_k():
    cycle = np.tile(np.arange(5), 400)  # 0 1 2 3 4 0 1 ...: the next token is fixed by the previous one
    counts = NgramCounts.of([cycle], vocab_size=5)
    refs = held_out_references(counts, cycle[:101].reshape(1, -1))
    assert refs["unigram"] == pytest.approx(math.log(5), rel=1e-3)
    assert refs["bigram"] < 0.01


def test_markov_references_sit_between_the_floor_and_log_v():
    cfg = data_settings("markov", seq_len=32, vocab_size=16, branching=3, train_sequences=2000, eval_sequences=32)
    data = build_dataset(cfg, seq_len=32, seed=0)
    refs = data.references
    # an order-2 chain: the previous token alone cannot reach the floor, frequencies alone do no better
    assert data.floor < refs["bigram"] <= refs["unigram"] + 1e-9 <= refs["log_vocab"] + 0.01


def test_text_references_are_measured_from_the_file(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(b"abab" * 2000)
    cfg = data_settings("text", path=str(text), seq_len=16, train_sequences=100, eval_sequences=8)
    refs = build_dataset(cfg, seq_len=16, seed=0).references
    assert refs["bigram"] < 0.01  # b always follows a, a always follows b
    # the first 90% (7200 bytes, 3600 of each) train: add-one over 256 byte values gives (3600 + 1) / (7200 + 256)
    assert refs["unigram"] == pytest.approx(-math.log(3601 / 7456))


def test_a_large_token_file_is_counted_in_evenly_spaced_stretches():
    ids = np.arange(1000)
    assert [s.tolist() for s in token_file_stretches(ids, budget=2000)] == [ids.tolist()]
    parts = token_file_stretches(ids, budget=40, pieces=4)
    assert [p[0] for p in parts] == [0, 330, 660, 990] and all(p.size == 10 for p in parts)
