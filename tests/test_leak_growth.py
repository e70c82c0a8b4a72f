"""C7's leak per evaluation step on hand-made twins: a leak below the threshold that still grows at the last
evaluation reads "not reached within N steps"; one that is flat reads "does not hold"; one above the threshold
holds whether it grows or not."""

from __future__ import annotations

import math

import pytest
from test_report_effects import cells_of, make_run, spread

from andrea_exp.report.cells import Cell
from andrea_exp.report.claims import c7
from andrea_exp.report.effects import FAILS, HOLDS, NOT_MEASURED
from andrea_exp.report.leak_growth import is_growing, last_rise, leak_se, leak_series, not_reached
from andrea_exp.report.leak_growth import pairs as leak_pairs
from andrea_exp.report.set_aside import SetAside
from andrea_exp.runs import metric_keys as mk

SE = 0.01
STEPS = (250, 500)


def run(seed, causal, losses, steps=STEPS, generation=None):
    records = {s: {mk.EVAL_LOSS_AS_TRAINED: v, mk.EVAL_LOSS_SE: SE} for s, v in zip(steps, losses)}
    return make_run(seed, causal=causal, final=losses[-1], se=SE, generation=generation, probes=records)


def pairs(open_losses, causal_losses=(2.2, 2.0), steps=STEPS):
    """3 seeds of a causal and an unmasked twin; the unmasked cell's losses are +- 0.01 per seed."""
    runs = []
    for seed in range(3):
        runs.append(run(seed, True, list(causal_losses), steps))
        runs.append(run(seed, False, [spread(v, seed) for v in open_losses], steps, generation=10.0))
    return runs


def test_the_leak_is_the_twin_minus_the_loss_as_trained_at_each_step_both_evaluated():
    causal = run(0, True, [2.5, 2.2, 2.0], steps=(100, 250, 500))
    open_ = run(0, False, [2.5, 2.15], steps=(100, 500))
    series = leak_series(causal, open_)
    assert [s for s, _ in series] == [100, 500]
    assert [v for _, v in series] == pytest.approx([0.0, -0.15])
    assert last_rise(series) == pytest.approx(-0.15) and last_rise(series[:1]) is None


def test_growing_means_a_last_rise_above_one_standard_error_of_a_leak():
    se = math.sqrt(2) * SE  # 0.0141: the standard error of a difference of two runs' losses
    assert is_growing([(250, 0.0), (500, 0.015)], se)
    assert not is_growing([(250, 0.0), (500, 0.014)], se)
    assert is_growing([(500, 0.1)], se) is None


def test_c7_a_leak_below_the_threshold_still_growing_is_not_reached_within_n_steps():
    # leak 0.0 at step 250, 0.05 at step 500 (< 0.1): the shortcut is being learned when the run ends
    stmt = c7.c7_leak(cells_of(pairs([2.2, 1.95])))
    (place,) = stmt.places
    assert place.effect.decision == FAILS  # what the last value alone says
    assert isinstance(place, SetAside) and place.decision == not_reached(500)
    assert stmt.verdict == (not_reached(500), f"{not_reached(500)} at d_k 64 (scale sqrt)")
    (rise,) = place.shown
    assert rise.stat.mean == pytest.approx(0.05)


def test_c7_a_flat_leak_below_the_threshold_does_not_hold():
    stmt = c7.c7_leak(cells_of(pairs([2.15, 1.95])))  # leak 0.05 at both steps
    (place,) = stmt.places
    assert not isinstance(place, SetAside) and place.decision == FAILS
    assert stmt.verdict[0] == FAILS


def test_c7_a_growing_leak_against_a_causal_twin_that_did_not_train_is_not_measured():
    # leak 0.0 -> 0.07, still growing, but the causal twin ends at 2.45, less than 0.1 below the bigram level
    # 2.5: the leak has no baseline, so the place is neither "not reached" nor "does not hold"
    stmt = c7.c7_leak(cells_of(pairs([2.5, 2.38], causal_losses=(2.5, 2.45))))
    (place,) = stmt.places
    assert not isinstance(place, SetAside) and place.decision == NOT_MEASURED
    assert place.unmeasurable == "the causal twin did not train"
    assert stmt.verdict == (NOT_MEASURED, "the causal twin did not train")
    (rise,) = place.shown  # the leak's growth is still shown
    assert rise.stat.mean == pytest.approx(0.07)


def test_c7_a_leak_above_the_threshold_holds_even_while_it_grows():
    stmt = c7.c7_leak(cells_of(pairs([2.1, 1.5])))  # leak 0.1 -> 0.5
    (place,) = stmt.places
    assert not isinstance(place, SetAside) and place.decision == HOLDS and stmt.verdict[0] == HOLDS


def test_a_leaks_standard_error_is_sqrt_2_times_the_pairs_mean_se_from_whichever_logged_one():
    causal, open_ = run(0, True, [2.2, 2.0]), run(0, False, [2.2, 1.9])
    open_.summary[mk.EVAL_LOSS_SE] = 3 * SE
    assert leak_se(causal, open_) == pytest.approx(math.sqrt(2) * 2 * SE)  # mean of 0.01 and 0.03
    open_.summary[mk.EVAL_LOSS_SE] = float("nan")
    assert leak_se(causal, open_) == pytest.approx(math.sqrt(2) * SE)  # the twin's NaN left out
    for r in (causal, open_):
        r.summary.pop(mk.EVAL_LOSS_SE)
        for record in r.records:
            record.pop(mk.EVAL_LOSS_SE, None)
    assert leak_se(causal, open_) is None


def test_the_last_rise_is_over_the_last_interval_and_one_se_exactly_is_not_growing():
    series = [(250, 0.0), (500, 0.02), (750, 0.07)]
    assert last_rise(series) == pytest.approx(0.05)  # 750 against 500, not 500 against 250
    assert is_growing([(250, 0.0), (500, 0.5)], 0.5) is False  # a rise of exactly one SE


def test_only_seeds_both_twins_finished_are_paired():
    causal = Cell({}, [run(0, True, [2.2, 2.0]), run(1, True, [2.2, 2.0]), run(2, True, [2.2, 2.0])])
    causal.runs[2].summary[mk.RUN_STATUS] = "diverged"
    open_ = Cell({}, [run(0, False, [2.2, 1.9]), run(2, False, [2.2, 1.9]), run(3, False, [2.2, 1.9])])
    assert sorted(leak_pairs(causal, open_)) == [0]  # seed 1 has no twin, 2 diverged, 3 has no causal run


def test_c7_not_reached_names_the_last_evaluation_and_the_rise_is_shown_by_name():
    stmt = c7.c7_leak(cells_of(pairs([2.4, 2.2, 1.95], causal_losses=(2.4, 2.2, 2.0), steps=(250, 500, 750))))
    (place,) = stmt.places
    assert isinstance(place, SetAside) and place.decision == not_reached(750)
    (rise,) = place.shown
    assert rise.name == "leak rise over the last evaluation interval" and rise.stat.mean == pytest.approx(0.05)


def test_c7_with_one_evaluation_shows_no_rise():
    stmt = c7.c7_leak(cells_of(pairs([1.95], causal_losses=(2.0,), steps=(500,))))
    (place,) = stmt.places
    assert place.shown == [] and not isinstance(place, SetAside)
