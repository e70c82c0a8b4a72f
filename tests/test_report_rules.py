"""Every rule of the report both ways, on hand-made Run objects (records + summary + config): where it must
hold and where it must fail, including each stated condition (premise, seed vote, best LR, dedupe)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from andrea_exp.report import bestlr, growth, screen, static, verdicts
from andrea_exp.report.__main__ import main as report_main
from andrea_exp.report.cells import LR_SWEEP, Cell, group_experiments
from andrea_exp.report.claims import c2, c3, c4, c5, c7, c9, vanish
from andrea_exp.report.effects import references
from andrea_exp.report.rules import progress
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import distinct_cells, paired, seed_check, seed_vote, seeds_needed, window_mean
from andrea_exp.report.stats import stat
from andrea_exp.report.study import Study

GRID_LR = 3e-3  # conf/train/default.yaml: an LR sweep's cells at this LR vote as the grid's LR
JOB = iter(range(10 ** 6))


def make_run(seed=0, *, name="claims_grid", scale="sqrt", d_k=64, lr=GRID_LR, causal=True, qk_init="unit", ln=False,
             max_steps=1000, status="finished", l0=4.0, final=2.0, floor=1.0, probes=None, summary=None) -> Run:
    """probes: step -> {key: value}; train/loss at step 0 is l0; final = eval/loss_as_trained."""
    config = {"seed": seed, "name": name, "model.d_k": d_k, "model.scale": scale, "model.causal": causal,
              "model.qk_init": qk_init, "model.qk_layernorm": ln, "train.lr": lr, "train.max_steps": max_steps}
    records = [{"step": 0, "train/loss": l0}]
    for step, values in sorted((probes or {}).items()):
        records.append({"step": step, **values})
    full = {"run/status": status, "eval/loss_as_trained": final, "eval/floor": floor, "data/log_vocab": 5.0,
            **(summary or {})}
    if final is not None:
        full["eval/below_floor"] = floor - final
    return Run(Path(f"/sweeps/{name}/{next(JOB)}"), config, full, records)


SYNTHETIC = []


@pytest.fixture(autouse=True)
def synthetic_once(monkeypatch):
    """The synthetic softmax rows are the same for every study: computed once for the whole file."""
    if not SYNTHETIC:
        SYNTHETIC.append(static.synthetic_softmax())
    monkeypatch.setattr(static, "synthetic_softmax", lambda: SYNTHETIC[0])


def study_of(runs, tmp_path) -> Study:
    return Study(runs, group_experiments(runs), tmp_path)


def model_checks(result, part=None):
    return [c for c in result.checks if c.where.get("source") != "synthetic" and
            (part is None or c.where.get("part", "").startswith(part))]


# ------------------------------------------------------------------ seeds, intervals, dedupe, window
def test_seed_vote_two_of_three():
    assert [seeds_needed(n) for n in (1, 2, 3, 4, 6)] == [1, 2, 2, 3, 4]
    assert seed_vote([True, True, False]) and not seed_vote([True, False, False]) and not seed_vote([])
    ok = seed_check({"d_k": 64}, {0: 0.9, 1: 0.8, 2: 0.1}, lambda v: v >= 0.5, ">= 0.5", lambda m: m - 0.5)
    split = seed_check({"d_k": 64}, {0: 0.9, 1: 0.2, 2: 0.1}, lambda v: v >= 0.5, ">= 0.5", lambda m: m - 0.5)
    assert ok.ok and not split.ok  # 2 of 3 passes, 1 of 3 fails
    assert "0: 0.9" in split.value and "1 of 3 pass" in split.value and "(>= 2 of 3 seeds)" in split.threshold
    assert split.distance == pytest.approx(0.4 - 0.5)
    assert seed_check({}, {}, bool, "", float) is None


def test_t_interval_by_hand():
    s = stat([1.0, 2.0, 3.0])  # mean 2, std 1, n 3: half width t_{0.975,2} / sqrt(3)
    assert s.half_width == pytest.approx(4.3027 / math.sqrt(3), rel=1e-4)
    assert "95% CI" in str(s) and math.isnan(stat([1.0]).half_width)


@pytest.mark.parametrize("df, quantile", [(1, 12.7062), (2, 4.3027), (30, 2.0423), (31, 2.0395), (60, 2.0003),
                                          (120, 1.9799)])
def test_t_quantile_is_exact_beyond_the_old_table(df, quantile):
    """Published 0.975 quantiles of Student's t: beyond 30 degrees of freedom they are not the normal's 1.96."""
    from andrea_exp.report.stats import t975

    assert t975(df) == pytest.approx(quantile, abs=1e-4)


def test_identical_runs_across_experiments_count_once(tmp_path):
    a = make_run(0, name="claims_grid")
    twin = make_run(0, name="qk_init")  # same science and seed, another experiment's name
    other_seed = make_run(1, name="qk_init")
    cell = Cell({}, [a, twin, other_seed], "claims_grid+qk_init")
    (kept,) = distinct_cells([cell])
    assert [r.seed for r in kept.runs] == [0, 1]
    failed_first = make_run(0, status="failed")
    (kept,) = distinct_cells([Cell({}, [failed_first, a], "x")])
    assert kept.runs == [a]  # a finished copy preferred
    study = study_of([a, twin, other_seed], tmp_path)
    assert sum(len(c.runs) for c in study.claim_cells) == 2


def test_window_mean_over_the_early_probes():
    run = make_run(probes={s: {"k": float(s)} for s in range(0, 401, 100)})
    assert window_mean("k")(run) == pytest.approx(100.0)  # steps 0, 100, 200
    assert window_mean("missing")(run) is None


# ------------------------------------------------------------------ best LR
def lr_cell(lr, finals, scale="sqrt", l0=4.0):
    runs = [make_run(s, name="lr_sensitivity", lr=lr, scale=scale, l0=l0, final=f,
                     status="finished" if f is not None else "diverged") for s, f in enumerate(finals)]
    return Cell({"train.lr": lr, "model.scale": scale}, runs, "lr_sensitivity", LR_SWEEP)


def test_best_lr_picks_the_lowest_mean_final_loss():
    cells = [lr_cell(1e-3, [2.0, 2.2]), lr_cell(1e-2, [1.5, 1.9]), lr_cell(1e-1, [None, 1.0])]
    # means 2.1, 1.7, (4.0 + 1.0) / 2 = 2.5: the diverged seed counts at l_0
    assert bestlr.best_lr(cells).cell.get("train.lr") == 1e-2
    cells.append(lr_cell(1e-4, [1.5, 1.9]))  # a tie goes to the smaller LR
    assert bestlr.best_lr(cells).cell.get("train.lr") == 1e-4
    # a group at one LR has no best LR (it would be read as one); at two it has
    assert len(bestlr.best_lr_cells(cells + [lr_cell(1e-3, [3.0, 3.0], scale="none")])) == 1
    assert len(bestlr.best_lr_cells(cells + [lr_cell(1e-3, [3.0, 3.0], scale="none"),
                                             lr_cell(1e-2, [2.0, 2.0], scale="none")])) == 2


def test_the_best_lr_says_when_it_sits_at_the_edge_of_the_sweep():
    inside = [lr_cell(1e-3, [2.0]), lr_cell(1e-2, [1.0]), lr_cell(1e-1, [3.0])]
    assert bestlr.best_lr(inside) == (inside[1], False)
    low, high = [lr_cell(1e-3, [1.0]), lr_cell(1e-2, [2.0])], [lr_cell(1e-3, [2.0]), lr_cell(1e-2, [1.0])]
    assert bestlr.best_lr(low).at_edge and bestlr.best_lr(high).at_edge
    alone = lr_cell(1e-3, [1.0])
    assert bestlr.best_lr([alone]) == (alone, False)  # one LR: no edge (and lr_groups never makes such a group)
    assert bestlr.best_lr_cells(inside) == [(inside[1], False)]


def test_a_run_that_ended_above_its_start_counts_at_its_start_in_every_best_lr():
    """One rule everywhere: the claims, the first screen's edge warnings and the fixes section all pick the same
    best LR (a finished run at 9.0 from l_0 4.0 counts 4.0, so the cell beside it at 3.9 is the best)."""
    low, worse_than_start, high = lr_cell(1e-3, [3.9, 3.9]), lr_cell(1e-2, [9.0, 1.0]), lr_cell(1e-1, [3.95, 3.95])
    assert bestlr.mean_final(worse_than_start) == 2.5  # (4.0 + 1.0) / 2: below 3.9, so the best lies inside
    sweep = [low, worse_than_start, high]
    assert bestlr.best_lr(sweep) == (worse_than_start, False)
    _, warnings = screen.data_box(verdicts.Cells.of(sweep), sweep)  # counted at 9.0 it would read low, at the edge
    assert not [w for w in warnings if w.startswith("best LR at the edge")], warnings
    _, warnings = screen.data_box(verdicts.Cells.of(sweep[:2]), sweep[:2])
    assert [w for w in warnings if w.startswith("best LR at the edge")]  # best of two LRs: always at an edge


def test_capped_final_caps_at_l0_and_keeps_the_loss_when_l0_is_unknown():
    assert bestlr.capped_final(make_run(l0=4.0, final=5.0)) == 4.0  # worse than the start counts as the start
    assert bestlr.capped_final(make_run(l0=4.0, final=2.5)) == 2.5
    no_l0 = make_run(l0=None, final=2.5, summary={"data/log_vocab": None})
    assert no_l0.initial_loss() is None and bestlr.capped_final(no_l0) == 2.5


def test_a_cell_with_no_known_loss_is_never_the_best():
    unknown = Cell({"train.lr": 1e-4}, [make_run(0, name="lr_sensitivity", lr=1e-4, l0=None, final=None,
                                                 status="diverged", summary={"data/log_vocab": None})],
                   "lr_sensitivity", LR_SWEEP)
    assert bestlr.mean_final(unknown) == math.inf
    measured = lr_cell(1e-2, [3.0, 3.0])
    assert bestlr.best_lr([unknown, measured]) == (measured, False)
    assert bestlr.best_lr([unknown]) is None and bestlr.best_lr_cells([unknown]) == []


def test_only_lr_sweep_cells_with_an_lr_axis_are_grouped():
    trained = Cell({"train.lr": 1e-3}, [make_run(0, lr=1e-3)], "claims_grid")  # a training cell, not a sweep
    sweep = [lr_cell(1e-3, [2.0]), lr_cell(1e-2, [1.0])]
    groups = bestlr.lr_groups([trained, *sweep])
    assert [[c.get("train.lr") for c in g] for g in groups] == [[1e-3, 1e-2]]


def test_paired_keeps_seeds_both_cells_ran_and_drops_non_finite():
    a = Cell({}, [make_run(s, final=1.0 + s) for s in (0, 1, 2)], "x")
    b = Cell({}, [make_run(s, final=10.0 * s) for s in (1, 2, 3)], "x")
    final = bestlr.final_loss
    assert paired(a, b, final, final, lambda x, y: y - x) == {1: 8.0, 2: 17.0}
    assert paired(a, b, final, final, lambda x, y: math.nan if y > 15 else None if y < 15 else 0.0) == {}


# ------------------------------------------------------------------ progress on the floor scale






def test_progress_with_a_small_or_no_learnable_gap():
    assert progress(2.0, 1.75, 1.5) == pytest.approx(0.5)  # a gap below 1 nat still counts
    assert progress(2.0, 1.0, 2.0) == 0.0  # no gap to close






# ------------------------------------------------------------------ C4 / C9: the gradient vanishes (rows)
def grad_probes(dead, jac_dead, p50, total=1.0, later=None):
    first = {"grad/scores_dead_frac": dead, "attn/jac_dead_frac": jac_dead, "grad/scores_row_p50": p50,
             "grad/scores": total, "attn/score_std": 1.0, "attn/max_prob": 0.2}
    return {0: first, 100: later or first}


def pair_runs(seeds_dead, d_k=64, later_dead=None):
    """Scaled twins alive; unscaled seeds dead (True) or alive (False)."""
    runs = []
    for seed, dead in enumerate(seeds_dead):
        later = None if later_dead is None else grad_probes(*(later_dead if dead else (0.0, 0.0, 1.0)))[0]
        runs.append(make_run(seed, scale="sqrt", d_k=d_k, probes=grad_probes(0.0, 0.0, 1.0)))
        runs.append(make_run(seed, scale="none", d_k=d_k,
                             probes=grad_probes(*((0.9, 0.9, 0.01) if dead else (0.0, 0.0, 1.0)), later=later)))
    return runs


def test_vanishing_gradient_on_rows_both_ways(tmp_path):
    part = "gradient through softmax vanishes"
    held = model_checks(c4.claim(study_of(pair_runs([True, True, True]), tmp_path)), part)
    assert len(held) == 6 and all(c.ok for c in held)  # 3 instruments x (init, early window)
    alive = model_checks(c4.claim(study_of(pair_runs([False, False, False]), tmp_path)), part)
    assert alive and not any(c.ok for c in alive)
    split = model_checks(c4.claim(study_of(pair_runs([True, False, False]), tmp_path)), part)
    assert not any(c.ok for c in split)  # 1 of 3 seeds
    two = model_checks(c4.claim(study_of(pair_runs([True, True, False]), tmp_path)), part)
    assert all(c.ok for c in two)  # 2 of 3 seeds


def test_vanishing_only_at_init_shows_in_the_window(tmp_path):
    # dead at step 0, alive at step 100: the window mean (0.45 dead) is below the gap
    checks = model_checks(c4.claim(study_of(pair_runs([True] * 3, later_dead=(0.0, 0.0, 1.0)), tmp_path)), "gradient")
    by_when = {(c.where["when"], c.where["instrument"]): c.ok for c in checks}
    assert all(ok for (when, _), ok in by_when.items() if when == "init")
    assert not any(ok for (when, _), ok in by_when.items() if when == vanish.WINDOW_TEXT)


def test_total_norm_is_not_voted(tmp_path):
    # rows alive but a tiny total norm: nothing votes "vanishes"
    runs = pair_runs([False] * 3)
    for run in runs:
        if run.config["model.scale"] == "none":
            for r in run.records:
                if "grad/scores" in r:
                    r["grad/scores"] = 1e-6
    result = c4.claim(study_of(runs, tmp_path))
    assert not any(c.ok for c in model_checks(result, "gradient"))


def test_c9_row_gradient_falls_with_d_k_both_ways(tmp_path):
    runs = pair_runs([True] * 3, d_k=64) + pair_runs([True] * 3, d_k=4096)
    for run in runs:  # unscaled median row gradient 10x lower at 4096
        if run.config["model.scale"] == "none" and run.config["model.d_k"] == 4096:
            for r in run.records:
                if "grad/scores_row_p50" in r:
                    r["grad/scores_row_p50"] = 0.001
    falls = model_checks(c9.claim(study_of(runs, tmp_path)), c9.PART_FALLS)
    flat = model_checks(c9.claim(study_of(runs, tmp_path)), c9.PART_FLAT)
    assert len(falls) == 1 and falls[0].ok and flat[0].ok
    same = model_checks(c9.claim(study_of(pair_runs([True] * 3, 64) + pair_runs([True] * 3, 4096), tmp_path)),
                        c9.PART_FALLS)
    assert not same[0].ok  # no fall when d_k changes nothing


# ------------------------------------------------------------------ C4: training stalls, at the best LR
def stall_runs(unscaled_finals_by_lr):
    runs = []
    for lr, u_final in unscaled_finals_by_lr.items():
        for seed in range(3):
            runs.append(make_run(seed, name="lr_sensitivity", lr=lr, scale="sqrt", final=1.5 if lr == 1e-3 else 3.0))
            runs.append(make_run(seed, name="lr_sensitivity", lr=lr, scale="none", final=u_final))
    return runs


def test_stalls_is_decided_at_each_cells_best_lr(tmp_path):
    # unscaled stalls at the scaled cell's best LR (1e-3) but trains at its own best LR (1e-4)
    trains_elsewhere = c4.claim(study_of(stall_runs({1e-4: 1.5, 1e-3: 3.9}), tmp_path))
    voted = [c for c in model_checks(trains_elsewhere, "training stalls") if c.vote]
    assert len(voted) == 1 and voted[0].where["lr scaled/unscaled"] == "0.001 / 0.0001"  # each at its best LR
    assert not voted[0].ok
    shown = [c for c in model_checks(trains_elsewhere, "training stalls (at every LR)")]
    assert {c.ok for c in shown} == {True, False} and not any(c.vote for c in shown)
    stalls = c4.claim(study_of(stall_runs({1e-4: 3.9, 1e-3: 3.8}), tmp_path))
    (voted,) = [c for c in model_checks(stalls, "training stalls") if c.vote]
    assert voted.ok


# ------------------------------------------------------------------ C3: premise
def peak_runs(raw_std, u_max_prob):
    runs = []
    for seed in range(3):
        runs.append(make_run(seed, scale="sqrt", probes={0: {"attn/max_prob": 0.2, "attn/score_std": 1.0},
                                                         500: {"attn/max_prob": 0.2}}))
        runs.append(make_run(seed, scale="none", probes={0: {"attn/max_prob": u_max_prob, "attn/score_std": raw_std},
                                                         500: {"attn/max_prob": 0.1}}))
    return runs


def test_c3_premise_met_or_not(tmp_path):
    (peaked, end) = model_checks(c3.claim(study_of(peak_runs(8.0, 0.9), tmp_path)))
    assert peaked.ok and peaked.vote and peaked.where["premise"] == "met" and not end.vote  # end shown only
    (flat, _) = model_checks(c3.claim(study_of(peak_runs(8.0, 0.3), tmp_path)))
    assert not flat.ok and flat.vote
    (unmet, _) = model_checks(c3.claim(study_of(peak_runs(1.0, 0.9), tmp_path)))
    assert not unmet.vote and unmet.where["premise"] == "not met"


# ------------------------------------------------------------------ C5: invariance across d_k
def test_c5_invariance_across_d_k_both_ways(tmp_path):
    def runs(std_4096):
        out = []
        for seed in range(3):
            for d_k, std in ((64, 1.0), (4096, std_4096)):
                out.append(make_run(seed, d_k=d_k, final=1.5, probes={0: {"attn/score_std": std, "attn/max_prob": 0.2},
                                                                      500: {"attn/score_std": std}}))
        return out
    ok = model_checks(c5.claim(study_of(runs(1.2), tmp_path)), "score std invariant")
    assert len(ok) == 2 and all(c.ok for c in ok)  # init and over training
    bad = model_checks(c5.claim(study_of(runs(8.0), tmp_path)), "score std invariant")
    assert not any(c.ok for c in bad)
    near = model_checks(c5.claim(study_of(runs(1.2), tmp_path)), "score std near 1")
    assert all(c.ok for c in near)
    assert not any(c.ok for c in model_checks(c5.claim(study_of(runs(8.0), tmp_path)), "score std near 1")[1:])


def test_c5_not_peaked_and_training_proceeds_both_ways(tmp_path):
    def parts(max_prob, final, status="finished"):
        runs = [make_run(s, final=final, status=status, probes={0: {"attn/score_std": 1.0, "attn/max_prob": max_prob}})
                for s in range(3)]
        return {c.where["part"]: c for c in c5.claim(study_of(runs, tmp_path)).checks}
    good = parts(0.2, 1.5)  # progress (4 - 1.5) / 3 = 0.83
    assert good["softmax not peaked at init"].ok and good["training proceeds"].ok
    bad = parts(0.8, 3.5)  # progress 0.17
    assert not bad["softmax not peaked at init"].ok and not bad["training proceeds"].ok
    assert not parts(0.2, 1.5, status="diverged")["training proceeds"].ok


# ------------------------------------------------------------------ C7: per seed, on runs that trained
def leak_runs(unmasked_finals, generation=4.5, floor_se=None):
    runs = []
    for seed, final in enumerate(unmasked_finals):
        summary = {"eval/loss_generation": generation, **({"eval/floor_se": floor_se} if floor_se else {})}
        runs.append(make_run(seed, name="leak_gap", causal=False, final=final, summary=summary))
        control = {**summary, "eval/loss_generation": 1.2}
        runs.append(make_run(seed, name="leak_gap", causal=True, final=1.2, summary=control))
    return runs


def c7_parts(runs, tmp_path):
    result = c7.claim(study_of(runs, tmp_path))
    return {c.where["part"]: c for c in result.checks}, result


def test_c7_leak_both_ways(tmp_path):
    parts, result = c7_parts(leak_runs([0.5, 0.5, 0.5]), tmp_path)  # floor 1.0: 0.5 nats below
    assert parts["loss as trained below the floor"].ok and parts[c7.CAUSAL_CONTROL].ok
    assert parts["generation loss far above the floor and the loss as trained"].ok  # 4.5 - 1 >= 0.5 x (5 - 1)
    parts, _ = c7_parts(leak_runs([1.01, 1.01, 1.01]), tmp_path)  # within the constant margin of 0.02
    assert not parts["loss as trained below the floor"].ok
    parts, _ = c7_parts(leak_runs([0.5, 0.5, 0.5], generation=2.0), tmp_path)
    assert not parts["generation loss far above the floor and the loss as trained"].ok


def test_c7_margin_from_the_floor_standard_error(tmp_path):
    # 0.05 below the floor: above the constant 0.02, but not 3 standard errors of 0.03
    parts, result = c7_parts(leak_runs([0.95] * 3, floor_se=0.03), tmp_path)
    assert not parts["loss as trained below the floor"].ok and "Every run judged records it" in result.notes[0]
    parts, result = c7_parts(leak_runs([0.95] * 3), tmp_path)
    assert parts["loss as trained below the floor"].ok and "No run read records it" in result.notes[0]


def test_c7_judges_only_seeds_that_trained(tmp_path):
    # seed 2 did not train (progress (4 - 3.9) / 3 < 0.5): it is left out, 2 of 2 remaining seeds pass
    parts, _ = c7_parts(leak_runs([0.5, 0.5, 3.9]), tmp_path)
    below = parts["loss as trained below the floor"]
    assert below.ok and "2 of 2 pass" in below.value
    none_trained, result = c7_parts(leak_runs([3.9, 3.9, 3.9]), tmp_path)
    assert "loss as trained below the floor" not in none_trained


def test_c7_moves_an_untrained_unmasked_cell_to_its_best_lr(tmp_path):
    runs = leak_runs([3.9, 3.9, 3.9])
    for lr, final in ((1e-4, 3.5), (1e-3, 0.5)):
        runs += [make_run(s, name="leak_lr", causal=False, lr=lr, final=final,
                          summary={"eval/loss_generation": 4.5}) for s in range(3)]
    parts, _ = c7_parts(runs, tmp_path)
    check = parts["loss as trained below the floor"]
    assert check.ok and check.where["at"] == "best LR 0.001"


# ------------------------------------------------------------------ C2: the premise is the q/k init
def test_c2_holds_only_for_unit_init(tmp_path):
    runs = [make_run(s, name="qk_init", qk_init=q, scale="none", probes={0: {"attn/score_std": std}})
            for s in range(3) for q, std in (("unit", 8.2), ("gpt2", 0.01), ("torch", 0.3))]
    result = c2.claim(study_of(runs, tmp_path))
    model = {c.where["premise"]: c for c in result.checks if "experiment" in c.where}
    assert model["model at init, qk_init=unit"].ok
    assert not model["model at init, qk_init=torch"].ok and not model["model at init, qk_init=gpt2"].ok


# ------------------------------------------------------------------ logit growth (extras)
def test_lr_sensitivity_of_the_extras_by_hand(tmp_path):
    cells = {}
    for lr, finals in ((1e-3, (2.0, 2.2)), (1e-2, (1.5, 1.6)), (1e-1, (None, None))):
        runs = [make_run(s, name="extras", lr=lr, final=f, status="finished" if f else "diverged")
                for s, f in enumerate(finals)]
        cells[lr] = Cell({"train.lr": lr}, runs, "extras", LR_SWEEP)
    # seed 0: l* 1.5; (0.5 + 0 + 2.5) / 3 = 1.0. seed 1: l* 1.6; (0.6 + 0 + 2.4) / 3 = 1.0
    assert growth.sensitivity(cells).mean == pytest.approx(1.0)
    refs = references(list(cells.values()))  # no bigram recorded: 0 at l_0 4, 1 at the floor 1
    assert [lr for lr, c in cells.items() if growth.trains(c, refs)] == [1e-3, 1e-2]  # progress 0.67.., diverged: no
    text = growth.growth_section(list(cells.values()), tmp_path / "figures" / "g.png")
    assert "| 64 | scale=sqrt ln=False | 0.01 |" in text
    assert "not measured" in growth.growth_section([], tmp_path / "g.png")


def extras_cell(lr, scale, finals, probes=None, ln=False):
    runs = [make_run(s, name="extras", lr=lr, scale=scale, ln=ln, final=f, status="finished" if f else "diverged",
                     d_k=4096, probes=probes) for s, f in enumerate(finals)]
    return Cell({"train.lr": lr, "model.scale": scale, "model.qk_layernorm": ln, "model.d_k": 4096}, runs, "extras",
                LR_SWEEP)


def test_extras_sensitivity_is_compared_over_the_lrs_every_row_ran(tmp_path):
    # sqrt ran 3 LRs, inv only the upper two: both are compared over {1e-2, 1e-1}
    cells = [extras_cell(1e-3, "sqrt", (1.0, 1.0)), extras_cell(1e-2, "sqrt", (2.0, 2.0)),
             extras_cell(1e-1, "sqrt", (3.0, 3.0)), extras_cell(1e-2, "inv", (1.5, 1.5)),
             extras_cell(1e-1, "inv", (1.5, 1.5))]
    groups = growth.grouped(cells)
    assert growth.shared_lrs(groups, 4096) == [1e-2, 1e-1]
    by_lr = groups[(4096, "scale=sqrt ln=False")]
    assert growth.sensitivity(by_lr).mean == pytest.approx((0 + 1 + 2) / 3)  # every LR: l* = 1.0
    assert growth.sensitivity(by_lr, [1e-2, 1e-1]).mean == pytest.approx((0 + 1) / 2)  # shared LRs: l* = 2.0
    text = growth.growth_section(cells, tmp_path / "figures" / "g.png")
    assert "0.5 ± 0 (n=2" in text and "over lr 0.01, 0.1" in text
    assert "never trains" not in text  # every row has an LR with progress >= 0.5


def test_extras_row_where_no_lr_trains_is_flagged(tmp_path):
    cells = [extras_cell(1e-2, "none", (3.9, 3.9)), extras_cell(1e-1, "none", (None, None))]
    text = growth.growth_section(cells, tmp_path / "figures" / "g.png")
    assert "| none |" in text and "never trains: not ranked" in text


def test_growth_table_reads_max_logit_spectral_norm_and_entropy_over_training(tmp_path):
    probes = {0: {"attn/score_max": 2.0, "attn/qk_spectral": 1.0, "attn/entropy": 4.0},
              100: {"attn/score_max": 50.0, "attn/qk_spectral": 30.0, "attn/entropy": 0.5},
              200: {"attn/score_max": 40.0, "attn/qk_spectral": 35.0, "attn/entropy": 0.25}}
    cells = [extras_cell(1e-2, "sqrt", (1.0, 1.0), probes), extras_cell(1e-1, "sqrt", (None, None), probes)]
    by_lr = growth.grouped(cells)[(4096, "scale=sqrt ln=False")]
    assert growth.growth_row(by_lr, 1e-1) == ["2", "50 (step 100)", "40 (step 200)", "1", "35 (step 200)",
                                              "4", "0.25 (step 200)"]
    assert growth.growth_row(by_lr, 3e-1) == ["-"] * 7
    text = growth.growth_section(cells, tmp_path / "figures" / "g.png")
    assert "| 4096 | scale=sqrt ln=False | 0.1 | 2 | 50 (step 100) |" in text  # the LR where the baseline fails


# ------------------------------------------------------------------ weak input
def test_no_runs_exits_non_zero_with_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        report_main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")])
    assert exit_info.value.code not in (0, None)
    message = str(exit_info.value.code)
    assert message.startswith("andrea-report: no runs under") and "\n" not in message


def test_short_runs_are_flagged(tmp_path):
    long = c4.claim(study_of(pair_runs([True] * 3), tmp_path))
    assert not any(c.short for c in long.checks)
    runs = pair_runs([True] * 3)
    for run in runs:
        run.config["train.max_steps"] = 50
    short = c4.claim(study_of(runs, tmp_path))
    assert all(c.short for c in model_checks(short, "gradient"))
    from andrea_exp.report.markdown import SHORT_WARNING, claim_section, header
    assert SHORT_WARNING in claim_section(short, [], tmp_path)
    assert "runs are shorter than 200 steps" in header(["x"], study_of(runs, tmp_path), None, [])


# ------------------------------------------------------------------ the text a reader sees, and seed bookkeeping


def test_seed_check_shows_each_seed_and_marks_the_failing_ones():
    values = {2: 0.25, 0: 0.75, 1: 0.5}  # seeds out of order: shown in seed order
    check = seed_check({"part": "p"}, values, lambda v: v >= 0.5, ">= 0.5", lambda m: m - 0.5)
    assert check.ok  # 2 of 3 seeds pass
    assert check.value.endswith("; seeds 0: 0.75, 1: 0.5, 2: 0.25 x; 2 of 3 pass")
    assert check.threshold == ">= 0.5 (>= 2 of 3 seeds)"
    assert check.distance == pytest.approx(0.0)


def test_per_seed_averages_runs_of_one_seed():
    from andrea_exp.report.seeds import per_seed

    cell = Cell({}, [make_run(0, final=1.0), make_run(0, final=3.0), make_run(1, final=5.0)], "e")
    assert per_seed(cell, lambda r: r.summary["eval/loss_as_trained"]) == {0: 2.0, 1: 5.0}


def test_init_only_runs_are_not_short_and_brief_ones_are():
    from andrea_exp.report.seeds import MIN_STEPS, is_short

    assert not is_short(make_run(max_steps=0))  # scaling at init: no training by design
    assert is_short(make_run(max_steps=1)) and is_short(make_run(max_steps=MIN_STEPS - 1))
    assert not is_short(make_run(max_steps=MIN_STEPS))


def test_a_later_duplicate_that_did_not_finish_never_replaces_the_kept_one():
    first, second = make_run(0, status="diverged"), make_run(0, status="failed")
    kept = distinct_cells([Cell({"x": 1}, [first], "e"), Cell({"x": 2}, [second], "e")])
    assert [r for c in kept for r in c.runs] == [first]




def test_distinct_cells_keep_the_first_finished_copy_their_labels_and_one_entry_per_run():
    first, again = make_run(0), make_run(0)  # two finished copies of one run
    cells = [Cell({"x": 1}, [first], "exp_a", LR_SWEEP), Cell({"x": 2}, [again, first], "exp_b")]
    kept = distinct_cells(cells)
    assert [(c.experiment, c.kind, c.runs) for c in kept] == [("exp_a", LR_SWEEP, [first])]


def test_a_vote_on_the_one_seed_of_three_that_trained_is_flagged(tmp_path):
    """Unmasked, only seed 0 trains (the others stay near l_0 = 4): the place is judged on that seed alone,
    1 of 1, and the check is flagged as thin; with all three trained nothing is flagged."""
    parts, result = c7_parts(leak_runs([0.5, 3.9, 3.9]), tmp_path)
    below = parts["loss as trained below the floor"]
    assert below.ok and below.thin and "(>= 1 of 1 seeds)" in below.threshold
    assert not parts[c7.CAUSAL_CONTROL].thin  # the causal control trained in all three seeds
    _, steady = c7_parts(leak_runs([0.5, 0.5, 0.5]), tmp_path)
    assert not any(c.thin for c in steady.checks)
    one_planned = seed_check({}, {0: 1.0}, bool, "", float, runs=[make_run(0)])
    assert not one_planned.thin  # one seed planned, one gave a value: nothing missing, no flag
    assert seed_check({}, {0: 1.0}, bool, "", float, runs=[make_run(0), make_run(1)]).thin  # 1 of 2 gave one
