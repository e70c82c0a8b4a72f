"""Memorising told from stalling, on hand-made runs: the per-run rule at its edges, C4b and C5b with a run whose
held-out loss rises while its training-split loss falls (memorised: set aside by name, never a stall) and with
one that plateaus on both (a stall), and the data box's lines."""

from __future__ import annotations

import pytest
from test_report_effects import cells_of, make_run, reference_runs, spread

from andrea_exp.report.cells import Cell
from andrea_exp.report.claims import c4, c5
from andrea_exp.report.effects import HOLDS, NOT_MEASURED, Effect, Place
from andrea_exp.report.memorisation import (
    MEMORISED,
    beside_training_loss,
    is_memorised,
    memorisation,
    memorised_warning,
    training_split_effect,
    without_memorised,
)
from andrea_exp.report.repeats import data_warnings, epochs_text
from andrea_exp.report.set_aside import SetAside
from andrea_exp.report.verdicts import verdict_with_aside
from andrea_exp.runs import metric_keys as mk

SE = 0.02


def evals(held: list[float], train: list[float], se: float = SE, steps=(250, 500)) -> dict:
    """Evaluation records: held-out loss, its SE and the training-split loss at each step."""
    return {s: {mk.EVAL_LOSS_AS_TRAINED: h, mk.EVAL_LOSS_SE: se, mk.EVAL_LOSS_TRAIN_SPLIT: t}
            for s, h, t in zip(steps, held, train)}


def run_with(held, train, seed=0, **kw):
    return make_run(seed, final=held[-1], probes=evals(held, train), **kw)


# ---------------------------------------------------------------- the rule, per run


def test_a_held_out_rise_of_3_se_while_training_falls_is_memorised():
    found = memorisation(run_with([3.0, 3.0 + 3 * SE], [2.8, 2.0]))
    assert (found.best_step, found.last_step) == (250, 500)
    assert found.rise == pytest.approx(0.06) and found.memorised


def test_less_than_3_se_or_a_training_loss_that_did_not_fall_is_not_memorised():
    assert not is_memorised(run_with([3.0, 3.0 + 2.9 * SE], [2.8, 2.0]))  # rose, but by 2.9 SE
    assert not is_memorised(run_with([3.0, 3.5], [2.8, 2.8]))  # training flat: not memorising
    assert not is_memorised(run_with([3.0, 3.5], [2.8, 3.1]))  # both rose: unstable, not memorising


def test_the_best_is_the_lowest_held_out_loss_whenever_it_came():
    found = memorisation(make_run(final=2.6, probes=evals([2.9, 2.5, 2.6], [2.9, 2.4, 2.1], steps=(100, 200, 300))))
    assert found.best_step == 200 and found.train_at_best == 2.4 and found.memorised  # 0.1 = 5 SE above step 200


def test_a_run_without_the_training_split_loss_is_not_measured():
    old = make_run(final=3.5, probes={250: {mk.EVAL_LOSS_AS_TRAINED: 3.0, mk.EVAL_LOSS_SE: SE},
                                      500: {mk.EVAL_LOSS_AS_TRAINED: 3.5, mk.EVAL_LOSS_SE: SE}})
    assert memorisation(old) is None and not is_memorised(old)


def test_without_memorised_drops_the_seeds_and_names_them():
    place = Place({"d_k": 64}, Effect("p", {0: 0.1, 1: 0.2, 2: 0.15}, high=0.25))
    cell = cells_of([run_with([3.0, 3.5], [2.8, 2.0], seed=1), run_with([3.0, 3.0], [2.8, 2.8], seed=0)]
                    ).training[0]
    kept = without_memorised(place, cell)
    assert kept.effect.values == {0: 0.1, 2: 0.15} and kept.where["memorised"] == "seed 1"
    assert not isinstance(kept, SetAside)


# ---------------------------------------------------------------- C4b and C5b


def twins(unscaled_held, unscaled_train, scaled_final=2.0, d_k=64):
    """3 seeds of a scaled and an unscaled causal cell (text data: progress 0 at the bigram level 2.5, 1 at the
    reference runs' 2.0): the scaled cell trains well, the unscaled one follows the given curves (+- 0.01 per
    seed)."""
    runs = []
    for seed in range(3):
        runs.append(run_with([scaled_final + 0.1, spread(scaled_final, seed)], [2.2, 1.9], seed, d_k=d_k))
        held = [spread(v, seed) for v in unscaled_held]
        runs.append(run_with(held, unscaled_train, seed, scale="none", d_k=d_k))
    return runs + reference_runs(2.0)


def test_c4b_a_memorised_unscaled_cell_is_named_and_not_a_stall():
    # held-out 3.0 -> 3.3 (15 SE up) while the training split falls 2.8 -> 2.0: progress -1.6 reads as a stall
    stmt = c4.c4_stall(cells_of(twins([3.0, 3.3], [2.8, 2.0])))
    (place,) = stmt.places
    assert isinstance(place, SetAside) and place.decision == MEMORISED
    assert place.effect.decision == HOLDS  # what the held-out loss alone would say: a stall
    verdict, condition = stmt.verdict
    assert verdict == NOT_MEASURED and verdict != HOLDS
    assert condition == f"{MEMORISED} at d_k 64 (lr 0.003)"


def test_c4b_a_cell_that_plateaus_on_both_losses_is_a_stall():
    stmt = c4.c4_stall(cells_of(twins([2.45, 2.45], [2.45, 2.45])))
    (place,) = stmt.places
    assert not isinstance(place, SetAside) and "memorised" not in place.where
    assert place.decision == HOLDS and stmt.verdict[0] == HOLDS
    (train,) = place.shown  # the training split read beside the held-out loss
    assert train.name == "progress on the training split" and train.stat.mean == pytest.approx(0.1)


def test_c5b_a_memorised_scaled_cell_is_named_not_failed():
    runs = [run_with([3.0, spread(3.3, s)], [2.5, 1.5], s, d_k=256) for s in range(3)]
    runs += [run_with([2.2, spread(2.0, s)], [2.2, 1.9], s, d_k=64) for s in range(3)]
    stmt = c5.c5_proceeds(cells_of(runs + reference_runs(2.0)))
    decisions = {p.where["d_k"]: p.decision for p in stmt.places}
    assert decisions == {64: HOLDS, 256: MEMORISED}
    assert stmt.verdict == ("holds where", f"d_k 64 (lr 0.003 (grid)); {MEMORISED} at d_k 256 (lr 0.003 (grid))")


def test_without_a_reference_a_memorised_place_stays_not_measured_not_set_aside():
    # progress cannot be read without a floor or a reference run: the place does not vote either way
    runs = [r for r in twins([3.0, 3.3], [2.8, 2.0]) if r.config.get("report_role") != "reference"]
    stmt = c4.c4_stall(cells_of(runs))
    (place,) = stmt.places
    assert not isinstance(place, SetAside) and place.decision == NOT_MEASURED and place.unmeasurable
    verdict, condition = stmt.verdict
    assert verdict == NOT_MEASURED and condition.startswith("no reference run")


def test_verdict_with_aside_leaves_a_statement_without_set_aside_places_alone():
    assert verdict_with_aside([Place({"d_k": 64}, Effect("p", {0: 1.0}, low=0.5))]) is None


# ---------------------------------------------------------------- the data box


def test_the_data_box_names_runs_that_repeated_or_memorised():
    repeated = make_run(0, final=2.0)
    repeated.summary[mk.DATA_EPOCHS] = 6.02
    once = make_run(1, final=2.0)
    once.summary[mk.DATA_EPOCHS] = 0.98
    memorised = run_with([3.0, 3.3], [2.8, 2.0], seed=2)
    memorised.summary[mk.DATA_EPOCHS] = 0.5
    lines = data_warnings([repeated, once, memorised], label=lambda r: f"seed {r.seed}")
    assert lines[0] == ("1 of 3 runs passed over their training data more than once (data/epochs > 1; their "
                        "held-out losses may read memorising as stalling): seed 0: 6.02 epochs")
    assert lines[1].startswith("1 runs memorised their training data") and "seed 2: held-out 3.000 (step 250) -> " \
        "3.300 (step 500), +15.0 SE; training split 2.800 -> 2.000" in lines[1]
    assert epochs_text([repeated, once]) == "6.02 at most; 1 of 2 runs above 1"
    assert epochs_text([once]) == "0.98 at most; no run above 1"


def test_runs_that_do_not_record_epochs_are_counted_as_unknown():
    (line,) = data_warnings([make_run(0, final=2.0)], label=str)
    assert line == "1 runs do not record data/epochs: whether they repeated their data is unknown"


def test_the_per_check_stall_votes_without_memorised_seeds():
    from andrea_exp.report.claims.c4 import stall_check

    runs = twins([3.0, 3.3], [2.8, 2.0])
    runs[1] = run_with([2.45, 2.45], [2.45, 2.45], seed=0, scale="none")  # seed 0 of the unscaled cell plateaus
    cells = {c.get("model.scale"): c for c in cells_of(runs).training}
    check = stall_check({"part": "stalls"}, cells["sqrt"], cells["none"], vote=True)
    assert check.where["memorised"] == "seed 1, 2"
    assert "; seeds 0: 0.209 x; 0 of 1 pass" in check.value  # only seed 0 votes (5 - 2.45 vs 5 - 1.99 closed)


# ---------------------------------------------------------------- the rule's edges and the places it changes


def test_the_standard_error_read_is_the_last_evaluations_and_must_be_positive():
    three = (100, 200, 300)
    rising = evals([2.9, 2.5, 2.6], [2.9, 2.4, 2.1], steps=three)
    for step in (100, 200):
        del rising[step][mk.EVAL_LOSS_SE]  # only the last evaluation logged its standard error: enough
    found = memorisation(make_run(final=2.6, probes=rising))
    assert found is not None and found.se == SE and found.memorised
    no_last_se = evals([3.0, 3.5], [2.8, 2.0])
    del no_last_se[500][mk.EVAL_LOSS_SE]
    assert memorisation(make_run(final=3.5, probes=no_last_se)) is None
    zero_se = make_run(final=3.5, probes=evals([3.0, 3.5], [2.8, 2.0], se=0.0))
    assert memorisation(zero_se) is None  # a rise in units of a zero standard error means nothing


def test_the_training_split_effect_reads_finished_runs_only_and_is_none_without_any():
    finished_run = run_with([3.0, 3.3], [2.8, 2.0], seed=0)
    diverged = run_with([3.0, 3.3], [2.8, 1.0], seed=1, status="diverged")
    effect = training_split_effect(Cell({}, [finished_run, diverged]), lambda loss: 3.0 - loss)
    assert effect.name == "progress on the training split" and effect.values == {0: pytest.approx(1.0)}
    old = make_run(0, final=2.0)  # no training-split loss logged
    assert training_split_effect(Cell({}, [old]), lambda loss: 3.0 - loss) is None


def test_without_memorised_keeps_each_effects_name_and_bounds_and_filters_the_also_effects():
    memorised = run_with([3.0, 3.5], [2.8, 2.0], seed=1)
    cell = Cell({}, [memorised, run_with([3.0, 3.0], [2.8, 2.8], seed=0)])
    also = Effect("q", {0: 1.0, 1: 9.0}, low=0.5)
    shown = Effect("s", {0: 1.0})
    place = Place({"d_k": 64}, Effect("p", {0: 0.1, 1: 0.2}, low=0.05, high=0.25), [also], [shown])
    kept = without_memorised(place, cell)
    assert kept.effect == Effect("p", {0: 0.1}, low=0.05, high=0.25)
    assert kept.also == [Effect("q", {0: 1.0}, low=0.5)] and kept.shown == [shown]
    alone = without_memorised(Place({"d_k": 64}, Effect("p", {1: 0.2}), [also], [shown]), cell)
    assert isinstance(alone, SetAside) and alone.decision == MEMORISED
    assert alone.also == [also] and alone.shown == [shown]  # set aside whole, shown as it was


def test_beside_training_loss_adds_nothing_without_a_training_split_and_drops_a_twins_memorised_seed():
    place = Place({"d_k": 64}, Effect("p", {0: 0.1, 1: 0.2}, high=0.25))
    plain = Cell({}, [make_run(0, final=2.0), make_run(1, final=2.0)])  # no training-split loss logged
    assert beside_training_loss(place, lambda loss: 3.0 - loss, plain).shown == []
    twin = Cell({}, [run_with([3.0, 3.5], [2.8, 2.0], seed=1)])  # the twin memorised seed 1
    kept = beside_training_loss(place, lambda loss: 3.0 - loss, plain, twin)
    assert kept.effect.values == {0: 0.1} and kept.where["memorised"] == "seed 1"


def test_the_data_box_names_each_memorised_run():
    runs = [run_with([3.0, 3.3], [2.8, 2.0], seed=s) for s in (1, 2)]
    assert memorised_warning(runs, label=lambda r: f"seed {r.seed}") == (
        "2 runs memorised their training data (held-out loss rose >= 3 SE above its best while the training-split "
        "loss fell; not counted as stalls): seed 1: held-out 3.000 (step 250) -> 3.300 (step 500), +15.0 SE; "
        "training split 2.800 -> 2.000; seed 2: held-out 3.000 (step 250) -> 3.300 (step 500), +15.0 SE; training "
        "split 2.800 -> 2.000")
