"""The report's verdict engine on hand-made runs: effect decisions on 95% t intervals, references and progress
(bigram level 0, floor or reference run 1; never a judged cell),
C3 / C4b / C7 places both ways on data with and without a
floor, summarise's three wordings, and the first screen (at most 60 lines, one row per statement)."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from pathlib import Path

import pytest

from andrea_exp.report import figures, reference, screen, static, verdicts
from andrea_exp.report.cells import INIT_ONLY, group_experiments
from andrea_exp.report.claims import c3, c4, c7
from andrea_exp.report.effects import (
    BY_CONSTRUCTION,
    FAILS,
    HOLDS,
    INCONCLUSIVE,
    NOT_MEASURED,
    Effect,
    Place,
    References,
    loss_or_l0,
    progress_of,
)
from andrea_exp.report.markdown import write_report
from andrea_exp.report.runs import Run
from andrea_exp.report.verdicts import CONDITIONAL, summarise
from andrea_exp.runs import metric_keys as mk

T2 = 4.302653  # t_{0.975} with 2 degrees of freedom
JOB = itertools.count()

# Data sources as the runs record them: text-like (no floor known) and markov-like (exact floor).
TEXT = {mk.DATA_BIGRAM_XENT: 2.5, mk.DATA_UNIGRAM_XENT: 3.3, mk.DATA_LOG_VOCAB: 5.0}
MARKOV = {mk.EVAL_FLOOR: 0.9, mk.DATA_BIGRAM_XENT: 3.06, mk.DATA_UNIGRAM_XENT: 3.4, mk.DATA_LOG_VOCAB: 5.0}
SOURCES = {"text": TEXT, "markov": MARKOV}


def make_run(seed=0, *, data="text", name="claims_grid", d_k=64, scale="sqrt", causal=True, qk_init="unit",
             lr=3e-3, max_steps=1000, status="finished", l0=5.0, final=2.0, generation=None, se=None,
             probes=None, role=None) -> Run:
    """A run as read from disk: flat config, summary, records (train/loss l0 at step 0, then `probes`:
    step -> {key: value}). final is eval/loss_as_trained; below_floor is floor - final where a floor is known."""
    source = SOURCES[data]
    config = {"seed": seed, "name": name, "data.name": data, "data.seq_len": 64, "model.d_k": d_k,
              "model.scale": scale, "model.causal": causal, "model.qk_init": qk_init, "model.qk_layernorm": False,
              "train.lr": lr, "train.max_steps": max_steps, **({"report_role": role} if role else {})}
    summary = {mk.RUN_STATUS: status, **source}
    if final is not None:
        summary[mk.EVAL_LOSS_AS_TRAINED] = final
        if mk.EVAL_FLOOR in source:
            summary[mk.EVAL_BELOW_FLOOR] = source[mk.EVAL_FLOOR] - final
    if generation is not None:
        summary[mk.EVAL_LOSS_GENERATION] = generation
    if se is not None:
        summary[mk.EVAL_LOSS_SE] = se
    records = [{"step": 0, mk.TRAIN_LOSS: l0}]
    for step, values in sorted((probes or {}).items()):
        if step == 0:
            records[0].update(values)
        else:
            records.append({"step": step, **values})
    return Run(Path(f"/sweeps/{name}/{next(JOB)}"), config, summary, records)


def cells_of(runs) -> verdicts.Cells:
    judged, refs = reference.split(runs)
    return verdicts.Cells.of([c for e in group_experiments(judged) for c in e.cells], refs)


def reference_runs(final: float, data: str = "text", n: int = 2) -> list[Run]:
    """report_role=reference runs: the scaled causal d_k 64 cell trained longer, ending at `final`."""
    return [make_run(seed, data=data, name="claims_grid_reference", max_steps=3000, final=final, role="reference")
            for seed in range(n)]


def spread(mean: float, seed: int, step: float = 0.01) -> float:
    """mean - step, mean, mean + step for seeds 0, 1, 2: mean `mean`, sample sd `step`."""
    return mean + (seed - 1) * step


def place_at(places, **want) -> Place:
    (found,) = [p for p in places if all(str(p.where.get(k)) == str(v) for k, v in want.items())]
    return found


# ------------------------------------------------------------------ 1. effect decisions
def test_three_seed_interval_is_the_t_interval_by_hand():
    e = Effect("x", {0: 1.0, 1: 2.0, 2: 3.0})
    half = T2 * 1.0 / math.sqrt(3)  # sd 1, n 3: 2.4844
    lo, hi = e.interval
    assert (lo, hi) == (pytest.approx(2 - half), pytest.approx(2 + half))
    assert e.text() == "2 [-0.484, 4.48] (n=3)"


@pytest.mark.parametrize("low, high, decision", [
    (-0.49, math.inf, HOLDS),  # interval [-0.484, 4.484] wholly above low
    (-0.48, math.inf, INCONCLUSIVE),  # low inside the interval
    (4.49, math.inf, FAILS),  # wholly below low
    (-math.inf, 4.49, HOLDS),  # wholly below high (the claim's side is low)
    (-math.inf, 4.48, INCONCLUSIVE),
    (-math.inf, -0.49, FAILS),  # wholly above high
    (-0.49, 4.49, HOLDS),  # inside a band
    (-0.49, 4.0, INCONCLUSIVE),  # straddles the band's top
])
def test_effect_decided_against_its_threshold(low, high, decision):
    assert Effect("x", {0: 1.0, 1: 2.0, 2: 3.0}, low, high).decision == decision


def test_one_seed_is_decided_on_its_value_and_says_n1():
    one = Effect("x", {7: 0.7}, low=0.5)
    assert one.interval == (0.7, 0.7)
    assert one.decision == HOLDS and one.text() == "0.7 (n=1)"
    assert Effect("x", {7: 0.7}, low=0.8).decision == FAILS
    assert Effect("x", {7: 0.7}, high=0.5).decision == FAILS


def test_identical_values_give_a_zero_width_interval():
    same = Effect("x", {0: 2.0, 1: 2.0}, low=1.99)
    assert same.interval == (2.0, 2.0)
    assert same.decision == HOLDS and same.text() == "2 [2, 2] (n=2)"
    assert Effect("x", {0: 2.0, 1: 2.0}, low=2.0).decision == FAILS  # on the threshold is not above it
    assert Effect("x", {0: 2.0, 1: 2.0}, low=2.01).decision == FAILS


def test_no_values_is_not_measured():
    none = Effect("x", {}, low=0.0)
    assert none.decision == NOT_MEASURED and none.text() == "-"
    assert Place({"d_k": 64}, Effect("y", {0: 1.0}, low=0.0), [none]).decision == NOT_MEASURED


def test_a_place_needs_its_also_effects():
    main = Effect("main", {0: 1.0, 1: 2.0, 2: 3.0}, low=-1.0)  # holds
    assert Place({"d_k": 64}, main).decision == HOLDS
    assert Place({"d_k": 64}, main, [Effect("a", {0: 1.0}, low=2.0)]).decision == FAILS
    assert Place({"d_k": 64}, main, [Effect("a", {0: 1.0, 1: 2.0, 2: 3.0}, low=0.0)]).decision == INCONCLUSIVE


# ------------------------------------------------------------------ 2. references and progress
def test_progress_from_bigram_to_floor_by_hand():
    refs = References(floor=1.0, unigram=3.3, bigram=2.5, log_vocab=5.0, reference=0.5, l0=5.0)
    assert refs.top == 1.0 and refs.top_name == "floor"  # the floor wins over a reference run
    assert refs.progress(1.75) == pytest.approx(0.5)  # (2.5 - 1.75) / (2.5 - 1.0)
    assert refs.progress(2.5) == pytest.approx(0.0) and refs.progress(1.0) == pytest.approx(1.0)
    assert refs.progress(None) is None
    # a reference at or above the bigram level: nothing to close, no progress
    assert References(3.0, None, 2.5, None, None, None).progress(2.0) is None
    # no bigram level recorded: the step-0 loss is 0
    no_bigram = References(1.0, None, None, None, None, 4.0)
    assert no_bigram.bottom_name == "l_0" and no_bigram.progress(2.5) == pytest.approx(0.5)


def test_progress_of_runs_with_a_floor():
    runs = [make_run(s, data="markov", d_k=d_k, final=f) for s in range(2) for d_k, f in ((64, 1.98), (256, 1.5))]
    c = cells_of(runs)
    (refs,) = c.refs.values()
    assert (refs.floor, refs.bigram, refs.unigram) == (0.9, 3.06, 3.4)
    assert refs.top == 0.9 and refs.top_name == "floor" and refs.reference is None
    assert progress_of(refs)(runs[0]) == pytest.approx((3.06 - 1.98) / (3.06 - 0.9))  # 0.5


def test_without_a_floor_the_top_is_the_reference_run_and_a_diverged_run_counts_at_l0():
    runs = [make_run(seed, name="claims_grid_reference", max_steps=3000, final=final, role="reference")
            for seed, final in ((0, 1.4), (1, 1.6))]
    for seed in range(2):
        runs.append(make_run(seed, d_k=64, final=(1.5, 1.7)[seed]))  # causal, mean 1.6
        # causal at d_k 256: seed 0 at 1.2, seed 1 diverged from l0 4.0 (its last eval of 0.5 does not count)
        runs.append(make_run(seed, d_k=256, final=(1.2, 0.5)[seed], status=("finished", "diverged")[seed], l0=4.0))
        runs += [make_run(seed, d_k=d_k, causal=False, final=0.02) for d_k in (64, 256)]  # unmasked: excluded
    c = cells_of(runs)
    (refs,) = c.refs.values()
    assert refs.floor is None and refs.top_name == "reference run" and refs.bottom_name == "bigram"
    # the reference runs' mean (1.4, 1.6 -> 1.5), never a judged cell's (the best causal cell, d_k 64, is at 1.6)
    assert refs.reference == pytest.approx(1.5) and refs.top == pytest.approx(1.5)
    assert len(refs.reference_runs) == 2 and all(x.runs for x in c.training)
    assert not any(r.config.get("report_role") for x in c.training for r in x.runs)  # judged nowhere
    diverged = runs[7]
    assert diverged.status == "diverged" and loss_or_l0(diverged) == 4.0
    assert progress_of(refs)(diverged) == pytest.approx((2.5 - 4.0) / (2.5 - 1.5))
    assert progress_of(refs)(runs[2]) == pytest.approx((2.5 - 1.5) / 1.0)


def test_without_a_floor_or_a_reference_run_progress_is_not_measured():
    """The best causal cell never sets progress 1: with no floor and no reference run there is no scale, and
    C4b / C5b say why instead of holding for a cell because of its own value."""
    runs = [make_run(seed, d_k=d_k, scale=scale, final=spread(final, seed))
            for seed in range(3) for d_k, scale, final in ((64, "sqrt", 1.6), (4096, "sqrt", 1.7),
                                                          (64, "none", 1.65), (4096, "none", 2.5))]
    c = cells_of(runs)
    (refs,) = c.refs.values()
    assert refs.top is None and refs.top_name == "none" and progress_of(refs)(runs[0]) is None
    c5b = c5_proceeds_of(c)
    assert all(p.decision == NOT_MEASURED and "no reference run" in p.unmeasurable for p in c5b.places)
    assert c5b.verdict[0] == NOT_MEASURED and "no reference run" in c5b.verdict[1]
    assert c4.c4_stall(c).verdict[0] == NOT_MEASURED
    # the same runs with a reference run at 1.6: the best scaled cell sits at progress 1, measured
    c = cells_of(runs + reference_runs(1.6))
    best = place_at(c5_proceeds_of(c).places, d_k=64)
    assert best.effect.stat.mean == pytest.approx(1.0) and best.decision == HOLDS


def c5_proceeds_of(c):
    from andrea_exp.report.claims import c5

    return c5.c5_proceeds(c)


# ------------------------------------------------------------------ 3. C4b: training stalls
# (data, scaled final, unscaled d_k 4096 final when it stalls / when it trains, bigram, reference)
C4B_DATA = [("text", 1.6, 2.5, 1.65, 2.5, 1.6), ("markov", 0.95, 3.06, 1.0, 3.06, 0.9)]


@pytest.mark.parametrize("stalls", [True, False], ids=["stalls", "trains"])
@pytest.mark.parametrize("data, scaled, stalled, trained, bigram, top", C4B_DATA, ids=["no floor", "floor"])
def test_c4b_stall_means_the_same_with_and_without_a_floor(data, scaled, stalled, trained, bigram, top, stalls):
    end = stalled if stalls else trained
    runs = []
    for seed in range(3):
        runs += [make_run(seed, data=data, d_k=d_k, scale="sqrt", final=scaled) for d_k in (64, 4096)]
        runs.append(make_run(seed, data=data, d_k=64, scale="none", final=scaled + 0.02))  # unscaled, small d_k
        runs.append(make_run(seed, data=data, d_k=4096, scale="none", final=spread(end, seed)))
    c = cells_of(runs + (reference_runs(top) if data == "text" else []))
    (refs,) = c.refs.values()
    assert refs.top == pytest.approx(top) and refs.bigram == bigram
    assert refs.top_name == ("floor" if data == "markov" else "reference run")
    stmt = c4.c4_stall(c)
    assert stmt.notes == [] and len(stmt.places) == 2  # both d_k vote
    place = place_at(stmt.places, d_k=4096)
    assert place.where == {"d_k": 4096, "lr": "0.003"}
    prog = (bigram - end) / (bigram - top)  # 0 when stalled, about 0.95 when trained, on both corpora
    assert place.effect.stat.mean == pytest.approx(prog)
    half = T2 * (0.01 / (bigram - top)) / math.sqrt(3)
    assert place.effect.interval == (pytest.approx(prog - half), pytest.approx(prog + half))
    (behind,) = place.also
    assert behind.stat.mean == pytest.approx((bigram - scaled) / (bigram - top) - prog)
    assert place.effect.decision == (HOLDS if stalls else FAILS)
    assert place.decision == (HOLDS if stalls else FAILS)
    assert place_at(stmt.places, d_k=64).decision == FAILS  # the unscaled d_k 64 trains
    if stalls:
        assert stmt.verdict == (CONDITIONAL,
                                "at 1 of 2 places: d_k 4096 (lr 0.003); does not hold at d_k 64 (lr 0.003)")
    else:
        assert stmt.verdict == (FAILS, "at every place measured (d_k 64, 4096 (lr 0.003))")


def test_c4b_stall_needs_the_scaled_twin_to_get_further():
    # both stall at the bigram level: the unscaled progress is below 0.25 but the divisor is not why
    runs = [make_run(seed, d_k=4096, scale=s, final=spread(2.5, seed)) for seed in range(3) for s in ("sqrt", "none")]
    runs += reference_runs(1.6)
    stmt = c4.c4_stall(cells_of(runs))
    (place,) = stmt.places
    assert place.effect.decision == HOLDS
    (behind,) = place.also
    assert behind.values == {0: pytest.approx(0.0), 1: pytest.approx(0.0), 2: pytest.approx(0.0)}
    assert behind.decision == FAILS and place.decision == FAILS


# ------------------------------------------------------------------ 4. C7: the shortcut without a mask
def test_c7_on_data_without_a_floor_every_place_votes():
    runs = []
    for seed in range(3):
        for d_k in (64, 256):
            runs.append(make_run(seed, d_k=d_k, causal=True, final=spread(1.6, seed), generation=spread(1.6, seed),
                                 se=0.01))
        # d_k 64: a shortcut (0.02 as trained, 10 at generation); d_k 256: ends at its twin's loss, no shortcut
        runs.append(make_run(seed, d_k=64, causal=False, final=0.02, generation=10.0, se=0.01))
        runs.append(make_run(seed, d_k=256, causal=False, final=spread(1.6, seed, -0.01), generation=1.7, se=0.01))
    stmt = c7.c7_leak(cells_of(runs))
    assert [p.where for p in stmt.places] == [{"d_k": 64, "scale": "sqrt"}, {"d_k": 256, "scale": "sqrt"}]
    leak = place_at(stmt.places, d_k=64)
    # twin - as trained: 1.57, 1.58, 1.59; margin max(0.1, 3 sqrt(2) 0.01 = 0.042) = 0.1
    assert leak.effect.low == pytest.approx(0.1)
    assert leak.effect.stat.mean == pytest.approx(1.58)
    (gen,) = leak.also  # no floor: only the generation effect
    assert gen.name == "generation loss - unigram level" and gen.stat.mean == pytest.approx(10 - 3.3)
    assert leak.decision == HOLDS
    honest = place_at(stmt.places, d_k=256)
    assert honest.effect.stat.mean == pytest.approx(0.0)  # -0.02, 0, 0.02: interval [-0.05, 0.05] below 0.1
    assert honest.effect.decision == FAILS and honest.decision == FAILS
    assert stmt.verdict == (CONDITIONAL, "at 1 of 2 places: d_k 64 (scale sqrt); does not hold at d_k 256 (scale sqrt)")
    assert stmt.headline is leak


@pytest.mark.parametrize("se, decision", [(0.01, HOLDS), (0.1, FAILS)])
def test_c7_leak_margin_is_three_standard_errors_of_a_difference(se, decision):
    # leak 0.3 +- 0.01: above 0.1, but below 3 sqrt(2) 0.1 = 0.424 when the loss SE is 0.1
    runs = []
    for seed in range(3):
        runs.append(make_run(seed, causal=True, final=1.6, se=se))
        runs.append(make_run(seed, causal=False, final=spread(1.3, seed), generation=10.0, se=se))
    (place,) = c7.c7_leak(cells_of(runs)).places
    assert place.effect.low == pytest.approx(max(0.1, 3 * math.sqrt(2) * se))
    assert place.effect.decision == decision


def test_c7_with_a_floor_shows_the_floor_test_beside_the_twin():
    runs = []
    for seed in range(3):
        runs.append(make_run(seed, data="markov", causal=True, final=spread(1.0, seed), generation=1.0))
        runs.append(make_run(seed, data="markov", causal=False, final=0.02, generation=10.0))
    (place,) = c7.c7_leak(cells_of(runs)).places
    assert [e.name for e in place.also] == ["generation loss - unigram level"]
    (floor,) = place.shown  # a stronger, sufficient test: shown, not required (a partial shortcut stays above it)
    assert floor.name == "floor - loss as trained"
    assert floor.stat.mean == pytest.approx(0.9 - 0.02) and floor.decision == HOLDS
    assert place.also[0].stat.mean == pytest.approx(10 - 3.4)
    assert place.effect.low == pytest.approx(0.1)  # no loss SE recorded: the 0.1 nats margin
    assert place.decision == HOLDS


# ------------------------------------------------------------------ 5. C3: every place votes; the crossover
def init_only_runs():
    """d_k 64, 4096 x sqrt / none at step 0 (max_steps 0): unscaled max prob 0.3 at d_k 64, 0.9 at 4096."""
    at0 = {(64, "sqrt"): (1.0, 0.1), (4096, "sqrt"): (1.0, 0.1), (64, "none"): (8.0, 0.3), (4096, "none"): (64.0, 0.9)}
    return [make_run(seed, name="qk_init", d_k=d_k, scale=s, max_steps=0, final=None,
                     probes={0: {mk.ATTN_SCORE_STD: std, mk.ATTN_MAX_PROB: spread(prob, seed)}})
            for seed in range(3) for (d_k, s), (std, prob) in at0.items()]


def test_c3_keeps_a_place_whose_softmax_is_not_peaked():
    c = cells_of(init_only_runs())
    assert {x.kind for x in c.init_only} == {INIT_ONLY} and not c.training
    stmt = c3.c3_peaked(c)
    (crossing,) = stmt.notes
    assert [p.where for p in stmt.places] == [{"d_k": 64, "phase": "init"}, {"d_k": 4096, "phase": "init"}]
    flat = place_at(stmt.places, d_k=64)
    assert flat.effect.stat.mean == pytest.approx(0.3)
    assert flat.effect.decision == FAILS and flat.decision == FAILS  # listed, not dropped
    (diff,) = flat.also
    assert diff.stat.mean == pytest.approx(0.2) and diff.decision == HOLDS  # still above its scaled twin
    peaked = place_at(stmt.places, d_k=4096)
    assert peaked.decision == HOLDS and peaked.also[0].stat.mean == pytest.approx(0.8)
    # step 0 is the initialisation's doing: shown with what it shows, not counted as evidence
    assert all(p.by_construction and not p.votes for p in stmt.places)
    assert flat.decision_text == f"{BY_CONSTRUCTION} ({FAILS})"
    assert stmt.verdict == (BY_CONSTRUCTION, "holds where at 1 of 2 places: d_k 4096 (phase init); does not hold at "
                                             "d_k 64 (phase init)")
    # points (std, prob): (1, 0.1) twice, (8, 0.3), (64, 0.9): 0.5 is a third of the way from 0.3 to 0.9, in
    # log std from 8 to 64: 8 * 8 ** (1 / 3) = 16
    assert crossing == "max prob crosses 0.5 at score std about 16 (step 0, every init and d_k)"


def test_c3_crossover_says_when_nothing_crosses():
    runs = [r for r in init_only_runs() if r.config["model.d_k"] == 64]
    (crossing,) = c3.c3_peaked(cells_of(runs)).notes
    assert crossing == "no crossing of max prob 0.5 among the cells at step 0"


# ------------------------------------------------------------------ 6. summarise
def held(d_k, decision, phase="init") -> Place:
    values = {HOLDS: {0: 1.0, 1: 1.0}, FAILS: {0: -1.0, 1: -1.0}, INCONCLUSIVE: {0: -1.0, 1: 1.0},
              NOT_MEASURED: {}}[decision]
    place = Place({"d_k": d_k, "phase": phase}, Effect("e", values, low=0.0))
    assert place.decision == decision
    return place


def test_summarise_all_hold():
    assert summarise([held(4096, HOLDS), held(64, HOLDS), held(256, NOT_MEASURED)]) == (
        HOLDS, "at every place measured (d_k 64, 4096 (phase init))")


def test_summarise_none_hold():
    assert summarise([held(64, FAILS), held(4096, FAILS)]) == (
        FAILS, "at every place measured (d_k 64, 4096 (phase init))")
    assert summarise([held(64, FAILS), held(4096, INCONCLUSIVE)]) == (
        INCONCLUSIVE, "at d_k 4096 (phase init); does not hold at d_k 64 (phase init)")
    assert summarise([held(64, NOT_MEASURED)]) == (NOT_MEASURED, "no runs measure it")
    assert summarise([]) == (NOT_MEASURED, "no runs measure it")


def test_summarise_mixed_names_the_places_with_d_k_merged():
    places = [held(64, FAILS), held(4096, HOLDS), held(256, HOLDS), held(1024, INCONCLUSIVE)]
    assert summarise(places) == (
        CONDITIONAL, "at 2 of 4 places: d_k 256, 4096 (phase init); does not hold at d_k 64 (phase init); "
                     "inconclusive at d_k 1024 (phase init)")
    # two phases: d_k merged within each phase
    places = [held(256, HOLDS, "init"), held(4096, HOLDS, "init"), held(4096, HOLDS, "end"), held(64, FAILS, "end")]
    assert summarise(places) == (CONDITIONAL, "at 3 of 4 places: d_k 256, 4096 (phase init); d_k 4096 (phase end); "
                                              "does not hold at d_k 64 (phase end)")
    # d_k and phase take two values each among the places that hold: d_k is merged on the tie
    places = [held(256, HOLDS, "init"), held(4096, HOLDS, "end")]
    assert summarise(places) == (HOLDS, "at every place measured (d_k 256 (phase init); d_k 4096 (phase end))")


# ------------------------------------------------------------------ 7. the first screen
def grid_runs(data: str) -> list[Run]:
    """A claims grid: d_k 64 / 256 / 4096 x sqrt / none x mask / no mask x 3 seeds, with probes at 0, 100, 1000.
    Scaled causal cells end at the reference + 0.7 (text: 1.6); unscaled causal ones stall at d_k 4096."""
    scaled_end = {"text": 1.6, "markov": 1.0}[data]
    bigram = SOURCES[data][mk.DATA_BIGRAM_XENT]
    runs = []
    for seed, d_k, scale, causal in itertools.product(range(3), (64, 256, 4096), ("sqrt", "none"), (True, False)):
        unscaled = scale == "none"
        std = math.sqrt(d_k) if unscaled else 1.0
        prob = min(0.95, 0.05 * std) if unscaled else 0.1
        grad = 1e-4 / d_k if unscaled else 1e-2
        end = bigram if unscaled and d_k == 4096 else scaled_end
        final = end if causal else 0.02
        probes = {step: {mk.ATTN_SCORE_STD: std, mk.ATTN_MAX_PROB: prob, mk.GRAD_SCORES_ROW_P50: grad,
                         mk.ATTN_SCORE_MAX: 3 * std, mk.ATTN_ENTROPY: 1.0, mk.GRAD_SCORES_DEAD_FRAC: 0.0}
                  for step in (0, 100, 1000)}
        for step in (100, 1000):
            probes[step][mk.TRAIN_LOSS] = 3.0
        runs.append(make_run(seed, data=data, d_k=d_k, scale=scale, causal=causal, final=spread(final, seed, 0.001),
                             generation=end if causal else 10.0, se=0.01, probes=probes))
    return runs


def screen_part(text: str) -> list[str]:
    """The first screen up to and including the grid matrix."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("Every place behind every verdict"))
    while not lines[end - 1].strip():
        end -= 1
    return lines[:end]


def verdict_rows(lines: list[str]) -> list[str]:
    start = lines.index("## Verdicts")
    table = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2:]))
    return [row.split("|")[1].strip() for row in table[2:]]


@pytest.mark.parametrize("data, reference, floor_cell", [
    ("text", "1 at its reference run (a run trained for that purpose and judged nowhere", "unknown"),
    ("markov", "1 at its floor.", "0.900")])
def test_first_screen_in_memory(data, reference, floor_cell):
    runs = grid_runs(data)
    all_cells = [c for e in group_experiments(runs) for c in e.cells]
    c = verdicts.Cells.of(all_cells, reference_runs(1.6) if data == "text" else [])
    stmts, notes = screen.statements(c)
    stmts = [s for s in stmts if s.source == "runs"]
    assert [s.id for s in stmts] == ["C2a", "C3", "C4a", "C4b", "C5a", "C5b", "C7", "C9"]
    text = screen.first_screen(c, all_cells, stmts, notes, ["- command: `andrea-report x`"], "appendix.md")
    lines = screen_part(text)
    assert len(lines) <= 60
    (progress_line,) = [line for line in lines if line.startswith("Progress:")]
    assert reference in progress_line
    if data == "markov":
        assert "reference run" not in progress_line
    (box_row,) = [line for line in lines if line.startswith("| claims_grid |")]
    assert f"| {floor_cell} |" in box_row
    assert verdict_rows(lines) == [s.id for s in stmts]
    # the grid: d_k 4096 row, held-out / generation / progress (masked) or leak (unmasked), by hand
    (row,) = [line for line in lines if line.startswith("| 4096 |")]
    bigram, top = {"text": (2.5, 1.6), "markov": (3.06, 0.9)}[data]
    scaled = {"text": 1.6, "markov": 1.0}[data]
    expect = [f"{scaled:.2f} / {scaled:.2f} / {(bigram - scaled) / (bigram - top):.2f}",
              f"0.02 / 10.00 / leak {scaled - 0.02:.2f}",
              f"{bigram:.2f} / {bigram:.2f} / 0.00",
              f"0.02 / 10.00 / leak {bigram - 0.02:.2f}"]
    assert [x.strip() for x in row.split("|")[2:-1]] == expect
    # C3 on a training grid: every d_k votes at init, early and end; d_k 64 (max prob 0.4) fails and is listed
    c3 = next(s for s in stmts if s.id == "C3")
    assert len(c3.places) == 9
    assert [p.decision for p in c3.places if p.where["d_k"] == 64] == [FAILS] * 3
    assert {p.decision for p in c3.places if p.where["d_k"] != 64} == {HOLDS}
    # C4b on the grid: the unscaled d_k 4096 stalls, the others train
    c4b = next(s for s in stmts if s.id == "C4b")
    assert c4b.verdict == (CONDITIONAL, "at 1 of 3 places: d_k 4096 (lr 0.003); does not hold at d_k 64, 256 "
                                        "(lr 0.003)")


def nest(flat: dict) -> dict:
    tree: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def write_run(run_dir: Path, run: Run) -> None:
    """The on-disk layout the training loop writes (tests/test_report.py's write_run)."""
    config = {**nest(run.config), "logger": {"mode": "disabled"}}
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("[]\n")
    (run_dir / ".hydra" / "config.yaml").write_text(json.dumps(config))
    (run_dir / "summary.json").write_text(json.dumps({**run.summary, "config": config}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.records))


SYNTHETIC = []


def empty_png(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_write_report_first_screen(tmp_path, monkeypatch):
    """The report on run directories on disk (no floor): the whole first screen, built-in rows included."""
    if not SYNTHETIC:
        SYNTHETIC.append(static.synthetic_softmax())
    monkeypatch.setattr(static, "synthetic_softmax", lambda: SYNTHETIC[0])
    # the first screen holds no figure: draw them in this process and write empty files (rasterising is slow)
    monkeypatch.setattr(figures, "drawn_in_parallel", contextlib.nullcontext)
    monkeypatch.setattr(figures, "_save", empty_png)

    for i, run in enumerate(grid_runs("text") + reference_runs(1.6)):
        write_run(tmp_path / "sweep" / str(i), run)
    out = tmp_path / "report"
    path = write_report([str(tmp_path / "sweep")], out, ["andrea-report", "sweep"])
    text = path.read_text()
    first = text.split("\n## Figures", 1)[0]
    lines = screen_part(first)
    assert len(lines) <= 60
    (progress_line,) = [line for line in lines if line.startswith("Progress:")]
    assert "1 at its reference run" in progress_line
    # one row per statement: the built-in checks too
    assert verdict_rows(lines) == ["C1", "C2a", "C2b", "C3", "C4a", "C4b", "C5a", "C5b", "C6", "C7", "C8", "C9"]
    assert "## Where each verdict comes from" in (out / "appendix.md").read_text()


def test_c7_a_partial_shortcut_above_the_floor_still_counts_as_a_leak():
    """Twin at 2.5, unmasked at 1.5 (a leak of 1 nat) but above the floor 0.9: the place holds on the twin."""
    runs = []
    for seed in range(3):
        runs.append(make_run(seed, data="markov", causal=True, final=spread(2.5, seed), generation=2.5))
        runs.append(make_run(seed, data="markov", causal=False, final=spread(1.5, seed), generation=9.0))
    (place,) = c7.c7_leak(cells_of(runs)).places
    assert place.shown[0].decision == FAILS  # not below the floor
    assert place.decision == HOLDS


def test_an_identical_rerun_of_one_seed_makes_no_interval():
    """The same seed run twice (a rerun into another sweep) is one run: n=1, no '95% CI 3..3'."""
    runs = [make_run(0, d_k=d, scale=s, final=f) for d in (64, 4096) for s, f in (("sqrt", 1.6), ("none", 2.5))]
    runs += [make_run(0, d_k=d, scale=s, final=f) for d in (64, 4096) for s, f in (("sqrt", 1.6), ("none", 2.5))]
    place = c4.c4_stall(cells_of(runs + reference_runs(1.6))).places[0]
    assert place.effect.stat.n == 1 and place.effect.text().endswith("(n=1)")


def test_the_logit_figure_reads_every_step_values_where_the_runs_logged_them():
    from andrea_exp.report.screen_figures import every_step_or_probe

    probed = [make_run(seed, d_k=d, scale=s, probes={0: {mk.ATTN_SCORE_MAX: 4.0}})
              for seed in range(2) for d in (64, 4096) for s in ("sqrt", "none")]
    assert every_step_or_probe(cells_of(probed), mk.ATTN_STEP_SCORE_MAX, mk.ATTN_SCORE_MAX) == mk.ATTN_SCORE_MAX
    stepped = [make_run(seed, d_k=d, scale=s, probes={k: {mk.ATTN_STEP_SCORE_MAX: 4.0 + k} for k in range(3)})
               for seed in range(2) for d in (64, 4096) for s in ("sqrt", "none")]
    assert every_step_or_probe(cells_of(stepped), mk.ATTN_STEP_SCORE_MAX, mk.ATTN_SCORE_MAX) == \
        mk.ATTN_STEP_SCORE_MAX
