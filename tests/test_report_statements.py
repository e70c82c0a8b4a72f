"""Every statement's decision pinned both ways on constructed runs: where it holds, where it does not, where it
is inconclusive, and the places that cannot vote (no reference, untrained twins, gradients exactly 0, step 0 set by
the initialisation). Each case asserts the exact verdict, so inverting a rule, dropping a band or a second
requirement, or letting a judged cell set its own reference fails here."""

from __future__ import annotations

import pytest
from test_report_effects import cells_of, make_run, place_at, reference_runs, spread

from andrea_exp.report import growth, lr
from andrea_exp.report.cells import LR_SWEEP, Cell
from andrea_exp.report.claims import c2, c3, c4, c5, c7, c9
from andrea_exp.report.effects import (
    BY_CONSTRUCTION,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_MEASURED,
    log10_ratio,
    references,
)
from andrea_exp.report.verdicts import CONDITIONAL
from andrea_exp.runs import metric_keys as mk

SEEDS = range(3)


def probed(seed, d_k, scale, values: dict, data="markov", causal=True, final=1.0, **kw):
    """A trained cell's run with the same probe values at step 0, in the early window (100) and at the end."""
    return make_run(seed, data=data, d_k=d_k, scale=scale, causal=causal, final=final,
                    probes={step: dict(values) for step in (0, 100, 1000)}, **kw)


# ------------------------------------------------------------------ C2a: the sqrt(d_k) law, at step 0 only
def c2a(std_4096: float):
    runs = [probed(s, d_k, "none", {mk.ATTN_SCORE_STD: std}) for s in SEEDS
            for d_k, std in ((64, 8.0), (4096, std_4096))]
    return c2.c2_growth(cells_of(runs))


def test_c2a_is_by_construction_at_init_and_says_what_it_shows():
    holds = c2a(64.0)  # log(64 / 8) / log(4096 / 64) = 0.5
    (place,) = holds.places
    assert place.where == {"init": "unit", "d_k": "64->4096"} and place.effect.stat.mean == pytest.approx(0.5)
    assert holds.verdict == (BY_CONSTRUCTION, "holds at every place measured (d_k 64->4096 (init unit))")
    # the band: a slope of 0 (std flat over d_k) is outside 0.5 +- 0.1
    assert c2a(8.0).verdict == (BY_CONSTRUCTION, "does not hold at every place measured (d_k 64->4096 (init unit))")
    assert c2a(8.0 * 64 ** 0.65).verdict[1].startswith("does not hold")  # slope 0.65: above the band
    assert c2a(8.0 * 64 ** 0.35).verdict[1].startswith("does not hold")  # slope 0.35: below it


# ------------------------------------------------------------------ C3: peaked without the divisor
def c3_of(unscaled_prob):
    runs = [probed(s, d_k, scale, {mk.ATTN_MAX_PROB: prob(s) if scale == "none" else 0.1})
            for s in SEEDS for d_k in (64, 4096) for scale, prob in (("sqrt", None), ("none", unscaled_prob))]
    return c3.c3_peaked(cells_of(runs))


def test_c3_holds_fails_and_is_inconclusive_on_the_trained_phases():
    assert c3_of(lambda s: 0.9).verdict == (
        HOLDS, "at every place measured (d_k 64, 4096 (phase early); d_k 64, 4096 (phase end)); "
               "step 0 by construction at init, not counted: 2 places")
    assert c3_of(lambda s: 0.3).verdict[0] == FAILS
    assert c3_of(lambda s: spread(0.5, s, 0.2)).verdict[0] == INCONCLUSIVE
    init = place_at(c3_of(lambda s: 0.9).places, d_k=64, phase="init")
    assert init.by_construction and not init.votes and init.decision_text == f"{BY_CONSTRUCTION} ({HOLDS})"


def test_c3_needs_the_unscaled_twin_above_the_scaled_one():
    runs = [probed(s, 64, scale, {mk.ATTN_MAX_PROB: 0.9}) for s in SEEDS for scale in ("sqrt", "none")]
    assert c3.c3_peaked(cells_of(runs)).verdict[0] == FAILS  # peaked, but no more than with the divisor


# ------------------------------------------------------------------ C4a: row gradients vanish
def c4a(log_ratio):
    runs = [probed(s, 4096, scale, {mk.GRAD_SCORES_ROW_P50: 1e-2 * (10 ** log_ratio(s) if scale == "none" else 1)})
            for s in SEEDS for scale in ("sqrt", "none")]
    return c4.c4_vanish(cells_of(runs))


@pytest.mark.parametrize("log_ratio, verdict", [
    (lambda s: -3.0, (HOLDS, "at every place measured (phase init, early (d_k 4096))")),
    (lambda s: 0.0, (FAILS, "at every place measured (phase init, early (d_k 4096))")),
    (lambda s: -0.5, (FAILS, "at every place measured (phase init, early (d_k 4096))")),  # 3x smaller: not 10x
    (lambda s: spread(-1.0, s, 0.5), (INCONCLUSIVE, "at phase init, early (d_k 4096)")),
])
def test_c4a_vanishing_is_an_order_of_magnitude_below_the_scaled_twin(log_ratio, verdict):
    assert c4a(log_ratio).verdict == verdict


# ------------------------------------------------------------------ C4b: training stalls (inconclusive case)
def test_c4b_inconclusive_where_the_unscaled_progress_straddles_the_threshold():
    # markov: bigram 3.06, floor 0.9; progress 0.25 at 2.52; seeds at 2.3, 2.52, 2.74 straddle it
    runs = []
    for s in SEEDS:
        runs += [make_run(s, data="markov", d_k=4096, scale="sqrt", final=1.0),
                 make_run(s, data="markov", d_k=4096, scale="none", final=spread(2.52, s, 0.22))]
    assert c4.c4_stall(cells_of(runs)).verdict == (INCONCLUSIVE, "at d_k 4096 (lr 0.003)")


# ------------------------------------------------------------------ C5a: scores near unit scale over d_k
def c5a(ratio_4096):
    runs = [probed(s, d_k, "sqrt", {mk.ATTN_SCORE_STD: 1.0 if d_k == 64 else ratio_4096(s)})
            for s in SEEDS for d_k in (64, 4096)]
    return c5.c5_unit_scale(cells_of(runs))


def test_c5a_band_both_ways_and_init_by_construction():
    ok = c5a(lambda s: 1.2)
    assert ok.verdict == (HOLDS, "at every place measured (phase early, end (d_k 4096 vs d_k 64)); "
                                 "step 0 by construction at init, not counted: 2 places")
    assert c5a(lambda s: 8.0).verdict[0] == FAILS  # 8x the smallest d_k's: outside the factor 2
    assert c5a(lambda s: 0.25).verdict[0] == FAILS  # a quarter: outside it on the other side
    assert c5a(lambda s: spread(2.0, s, 0.5)).verdict[0] == INCONCLUSIVE


# ------------------------------------------------------------------ C5b: training proceeds with the divisor
@pytest.mark.parametrize("final, verdict", [
    (lambda s: 1.0, HOLDS),  # progress (3.06 - 1) / (3.06 - 0.9) = 0.95
    (lambda s: 2.9, FAILS),  # 0.07
    (lambda s: spread(1.98, s, 0.6), INCONCLUSIVE),  # 0.22, 0.5, 0.78
])
def test_c5b_progress_against_the_floor(final, verdict):
    runs = [make_run(s, data="markov", d_k=d_k, final=final(s)) for s in SEEDS for d_k in (64, 4096)]
    assert c5.c5_proceeds(cells_of(runs)).verdict[0] == verdict


def test_c5b_no_cell_holds_because_of_its_own_value():
    """Text without a reference run: the best scaled cell would be progress 1 by definition if it set the scale;
    it does not, so nothing is measured. A reference run below it makes the same cell fail honestly."""
    runs = [make_run(s, d_k=d_k, final=final) for s in SEEDS for d_k, final in ((64, 2.3), (4096, 2.4))]
    assert c5.c5_proceeds(cells_of(runs)).verdict == (
        NOT_MEASURED, "no reference run: the data has no known floor and no report_role=reference run was trained "
                      "on it")
    # bigram 2.5, reference 1.5: d_k 64 at 2.3 is progress 0.2, d_k 4096 0.1
    judged = c5.c5_proceeds(cells_of(runs + reference_runs(1.5)))
    assert judged.verdict == (FAILS, "at every place measured (d_k 64, 4096 (lr 0.003 (grid)))")


# ------------------------------------------------------------------ C7: the shortcut, against a twin that trained
def c7_runs(causal_final, open_final, data="text", d_k=64):
    return [x for s in SEEDS for x in (
        make_run(s, data=data, d_k=d_k, causal=True, final=spread(causal_final, s), generation=causal_final),
        make_run(s, data=data, d_k=d_k, causal=False, final=spread(open_final, s), generation=9.0))]


def test_c7_both_ways_and_inconclusive():
    assert c7.c7_leak(cells_of(c7_runs(1.6, 0.5))).verdict == (HOLDS, "at every place measured (d_k 64 (scale sqrt))")
    assert c7.c7_leak(cells_of(c7_runs(1.6, 1.6))).verdict[0] == FAILS
    runs = [x for s in SEEDS for x in (make_run(s, causal=True, final=1.6, generation=1.6),
                                       make_run(s, causal=False, final=1.5 + (s - 1) * 0.1, generation=9.0))]
    assert c7.c7_leak(cells_of(runs)).verdict[0] == INCONCLUSIVE  # leak 0.1 +- 0.1 straddles 0.1


def test_c7_a_twin_that_did_not_train_does_not_vote_and_the_headline_is_where_it_did():
    # text: bigram 2.5; trained means at least 0.1 below it. d_k 4096: twin stalled at 2.45, open at 0.5 (a big
    # "leak" against an untrained baseline); d_k 64: twin trained at 1.6, open at 1.0
    runs = c7_runs(1.6, 1.0) + c7_runs(2.45, 0.5, d_k=4096) + c7_runs(2.45, 2.45, d_k=256)
    stmt = c7.c7_leak(cells_of(runs))
    assert place_at(stmt.places, d_k=4096).unmeasurable == "the causal twin did not train"
    assert place_at(stmt.places, d_k=256).unmeasurable == "neither twin trained"
    assert place_at(stmt.places, d_k=4096).decision_text == "not measured: the causal twin did not train"
    assert stmt.headline is place_at(stmt.places, d_k=64)  # not the largest leak (4096's 1.95)
    assert stmt.verdict == (HOLDS, "at every place measured (d_k 64 (scale sqrt)); not measured at d_k 256 "
                                   "(scale sqrt) (neither twin trained); not measured at d_k 4096 (scale sqrt) "
                                   "(the causal twin did not train)")


# ------------------------------------------------------------------ C9: falls without the divisor, flat with it
def c9_of(none_4096, sqrt_4096=lambda s: 1e-2, none_64=1e-2):
    runs = []
    for s in SEEDS:
        runs += [probed(s, 64, "none", {mk.GRAD_SCORES_ROW_P50: none_64}),
                 probed(s, 4096, "none", {mk.GRAD_SCORES_ROW_P50: none_4096(s)}),
                 probed(s, 64, "sqrt", {mk.GRAD_SCORES_ROW_P50: 1e-2}),
                 probed(s, 4096, "sqrt", {mk.GRAD_SCORES_ROW_P50: sqrt_4096(s)})]
    return c9.c9_flat(cells_of(runs))


def test_c9_holds_fails_and_is_inconclusive_with_the_span_shown():
    holds = c9_of(lambda s: 1e-4)
    assert [p.where for p in holds.places] == [{"d_k": "64->4096", "phase": ph} for ph in ("init", "early", "end")]
    assert holds.verdict == (HOLDS, "at every place measured (phase init, early, end (d_k 64->4096))")
    assert c9_of(lambda s: 1e-2).verdict[0] == FAILS  # flat without the divisor: it does not fall
    assert c9_of(lambda s: 1e-2 * 10 ** spread(-1.0, s, 0.5)).verdict[0] == INCONCLUSIVE


def test_c9_needs_the_divisor_to_keep_it_flat():
    both_fall = c9_of(lambda s: 1e-4, sqrt_4096=lambda s: 1e-4)  # the second requirement fails
    assert both_fall.verdict[0] == FAILS
    assert all(p.effect.decision == HOLDS and p.also[0].decision == FAILS for p in both_fall.places)


def test_c9_a_gradient_exactly_0_at_both_ends_does_not_vote():
    """0 at d_k 64 and at 4096 in every seed: there is no ratio (a clamp would read a change of 0 and fail it)."""
    stmt = c9_of(lambda s: 0.0, none_64=0.0)
    assert all(p.decision == NOT_MEASURED for p in stmt.places)
    assert stmt.verdict[0] == NOT_MEASURED and "row gradient exactly 0 at both ends (none)" in stmt.verdict[1]
    assert log10_ratio(0.0, 0.0) is None and log10_ratio(0.0, 1e-2) == pytest.approx(-28.0)


def test_holds_where_counts_the_places():
    # C9 holding at init only: the unscaled gradient falls at step 0 and recovers later
    runs = []
    for s in SEEDS:
        for d_k, scale in ((64, "none"), (4096, "none"), (64, "sqrt"), (4096, "sqrt")):
            fall = scale == "none" and d_k == 4096
            runs.append(make_run(s, data="markov", d_k=d_k, scale=scale, probes={
                0: {mk.GRAD_SCORES_ROW_P50: 1e-4 if fall else 1e-2},
                100: {mk.GRAD_SCORES_ROW_P50: 1e-2}, 1000: {mk.GRAD_SCORES_ROW_P50: 1e-2}}))
    assert c9.c9_flat(cells_of(runs)).verdict == (
        CONDITIONAL, "at 1 of 3 places: d_k 64->4096 (phase init); does not hold at phase early, end (d_k 64->4096)")


# ------------------------------------------------------------------ one scale for "trains" (growth, LR sensitivity)
def lr_cell(lr, scale, final, name="extras", l0=5.6, d_k=4096):
    runs = [make_run(s, name=name, lr=lr, scale=scale, d_k=d_k, l0=l0, final=final) for s in SEEDS]
    return Cell({"train.lr": lr, "model.scale": scale, "model.d_k": d_k}, runs, name, LR_SWEEP)


def test_trains_reads_the_verdicts_scale_not_a_floor_of_0(tmp_path):
    """Text (bigram 2.5): 2.7 at l_0 5.6 closed 52% of the way to 0, yet sits above the bigram level: the
    attention did nothing, so that LR does not train the cell; 1.6 does."""
    above, below = lr_cell(6e-2, "inv", 2.7), lr_cell(1.2e-2, "inv", 1.6)
    refs = references([above, below])
    assert refs.top is None  # no floor, no reference run: trains means 0.1 below the bigram level
    assert not growth.trains(above, refs) and growth.trains(below, refs)
    text = growth.growth_section([above, below], tmp_path / "figures" / "g.png")
    assert "| 4096 | scale=inv ln=False | 0.012 |" in text  # the largest LR that trains
    # with a reference run at 1.5 the scale has a top: 1.6 is progress 0.9, 2.7 is below 0
    refs = references([above, below], reference_runs(1.5))
    assert refs.top_name == "reference run" and growth.trains(below, refs) and not growth.trains(above, refs)


def test_lr_sensitivity_compares_settings_over_one_lr_set_and_marks_one_that_never_trains(tmp_path):
    lrs6 = (1e-4, 5e-4, 2.5e-3, 1.2e-2, 6e-2, 3e-1)
    sqrt = [lr_cell(x, "sqrt", f, name="lr_sensitivity") for x, f in zip(lrs6, (1.9, 1.7, 1.8, 2.5, 3.2, 4.0))]
    inv = [lr_cell(x, "inv", f, name="lr_sensitivity") for x, f in zip(lrs6[2:], (1.7, 1.75, 2.8, 3.3))]
    dead = [lr_cell(x, "none", f, name="lr_sensitivity") for x, f in zip(lrs6[2:], (3.0, 3.1, 3.2, 3.3))]
    curves = {next(t for t in c.context.split() if t.startswith("scale=")): c
              for c in lr.lr_curves(sqrt + inv + dead, {})}
    # over the 4 LRs all three ran: sqrt's l* is 1.8 there, (0 + 0.7 + 1.4 + 2.2) / 4 = 1.075
    assert curves["scale=sqrt"].over == list(lrs6[2:])
    assert curves["scale=sqrt"].sensitivity.mean == pytest.approx((0 + 0.7 + 1.4 + 2.2) / 4)
    assert curves["scale=inv"].sensitivity.mean == pytest.approx((0 + 0.05 + 1.1 + 1.6) / 4)
    assert curves["scale=none"].trains_at == []  # every loss above the bigram level (2.5) - 0.1
    text = lr.lr_section(sqrt + inv + dead, tmp_path / "figures" / "lr.png", {})
    (row,) = [line for line in text.splitlines() if "scale=none" in line]
    assert "never trains: not ranked" in row
    assert "Compared over lr 0.0025, 0.012, 0.06, 0.3" in text
