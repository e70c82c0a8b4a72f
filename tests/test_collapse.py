"""The entropy-collapse rule (Zhai et al. 2023) on constructed runs: collapsed, not collapsed (either condition
missing), and not measurable (does not vote)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from andrea_exp.report.collapse import COLLAPSE_FRACTION, Reading, cell_collapsed, read
from andrea_exp.report.effects import References, threshold
from andrea_exp.report.runs import Run
from andrea_exp.runs import metric_keys as mk

T = 128
BIGRAM = 2.5
REFS = References(floor=None, unigram=3.3, bigram=BIGRAM, log_vocab=math.log(256), reference=1.5, l0=5.5)
LOW = 0.04  # nats: the Shakespeare d_k 4096 cell's final entropy, far below 0.1 x log 128 = 0.485
HIGH = 1.2


def run(entropy=LOW, loss=BIGRAM + 0.02, status="finished", seq_len=T) -> Run:
    summary = {mk.RUN_STATUS: status, mk.EVAL_LOSS_AS_TRAINED: loss, mk.RUN_STEPS: 1000}
    records = [{"step": 0, mk.TRAIN_LOSS: 5.5}]
    if entropy is not None:
        records.append({"step": 1000, mk.ATTN_ENTROPY: entropy})
    return Run(Path("/sweeps/extras/0"), {"data.seq_len": seq_len}, summary, records)


def test_sharp_attention_at_the_bigram_level_is_collapse():
    reading = read(run(), REFS)
    assert reading.collapsed is True
    assert reading.entropy_fraction == pytest.approx(LOW / math.log(T))
    assert "at the bigram level" in reading.why and "< 0.1" in reading.why


@pytest.mark.parametrize("entropy,loss", [
    (HIGH, BIGRAM + 0.02),  # broad attention at the bigram level: stalled, not collapsed
    (LOW, BIGRAM - 0.5),  # sharp attention with a loss well below the bigram level: it learned (e.g. induction)
    (COLLAPSE_FRACTION * math.log(T) * 1.01, BIGRAM),  # just above the entropy line
    (LOW, BIGRAM - 0.11),  # just more than TRAINED (0.1 nats) below the bigram level
])
def test_either_condition_missing_is_not_collapse(entropy, loss):
    assert read(run(entropy=entropy, loss=loss), REFS).collapsed is False


def test_just_inside_both_lines_is_collapse():
    assert read(run(entropy=COLLAPSE_FRACTION * math.log(T) * 0.99, loss=BIGRAM - 0.09), REFS).collapsed is True


@pytest.mark.parametrize("made,why", [
    (dict(status="diverged"), "the run diverged"),
    (dict(status="failed"), "the run failed"),
    (dict(entropy=None), "no attention entropy"),
    (dict(entropy=float("nan")), "no attention entropy"),
    (dict(seq_len=None), "no context length"),
])
def test_a_run_that_cannot_be_read_does_not_vote(made, why):
    reading = read(run(**made), REFS)
    assert reading.collapsed is None and why in reading.why


def test_no_bigram_level_does_not_vote_and_a_cell_votes_over_the_seeds_it_can_read():
    no_bigram = References(floor=None, unigram=None, bigram=None, log_vocab=None, reference=None, l0=5.5)
    assert read(run(), no_bigram).collapsed is None
    assert cell_collapsed([run(), run(), run(entropy=HIGH)], REFS) is True  # 2 of 3
    assert cell_collapsed([run(), run(entropy=HIGH), run(entropy=HIGH)], REFS) is False  # 1 of 3
    assert cell_collapsed([run(), run(), run(status="failed")], REFS) is True  # the failed seed does not vote
    assert cell_collapsed([run(status="diverged"), run(entropy=None)], REFS) is None  # nobody can be read


def test_each_line_itself_is_on_the_not_collapsed_side():
    """An entropy of exactly 0.1 x log T is not below the line; a loss exactly TRAINED (0.1) nats below the bigram
    level counts as learned, not as at the bigram level."""
    at_entropy_line = COLLAPSE_FRACTION * math.log(T)
    assert at_entropy_line / math.log(T) == COLLAPSE_FRACTION  # the line itself, to the bit, at T = 128
    reading = read(run(entropy=at_entropy_line), REFS)
    assert reading.collapsed is False and ">= 0.1" in reading.why and "at the bigram level" in reading.why
    learned = read(run(loss=BIGRAM - threshold("TRAINED")), REFS)
    assert learned.collapsed is False and "< 0.1" in learned.why and "below the bigram level" in learned.why


def test_a_context_of_two_keys_is_read_and_of_one_key_is_not():
    """log 2 is the entropy of a uniform row over two keys; one key has no entropy to lose (log 1 = 0)."""
    assert read(run(seq_len=2), REFS).entropy_fraction == pytest.approx(LOW / math.log(2))
    assert read(run(seq_len=2), REFS).collapsed is True
    one = read(run(seq_len=1), REFS)
    assert one.collapsed is None and one.why == "not measured: no context length (data.seq_len)"
    assert read(run(seq_len=True), REFS).collapsed is None  # a flag is not a length


def test_why_a_run_does_not_vote_is_named():
    no_bigram = References(floor=None, unigram=None, bigram=None, log_vocab=None, reference=None, l0=5.5)
    assert read(run(), no_bigram).why == "not measured: no bigram level for its data"
    assert read(run(entropy=None), REFS).why == "not measured: no attention entropy logged"
    no_loss = Run(Path("/sweeps/extras/1"), {"data.seq_len": T}, {mk.RUN_STATUS: "finished"},
                  [{"step": 1000, mk.ATTN_ENTROPY: LOW}])  # no held-out loss, no step-0 loss to stand for it
    assert read(no_loss, REFS) == Reading(None, "not measured: no held-out loss")
