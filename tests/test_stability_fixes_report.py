"""The section "Every fix at every d_k" on constructed runs: the best-LR transfer rule both ways and where a best LR
is not bracketed, the LR sensitivity of a hand-made curve, and which side a failed run fails on with z-loss off
and on (removes, does not remove, not measured)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from andrea_exp.report import growth
from andrea_exp.report.cells import group_experiments
from andrea_exp.report.effects import References
from andrea_exp.report.fixes import (
    ATTENTION,
    NEITHER,
    NOT_MEASURED,
    OUTPUT,
    TRAINS,
    BestLR,
    best_lr,
    failure_side,
    fixes_section,
    grouped,
    sides,
    transfer,
)
from andrea_exp.report.runs import Run
from andrea_exp.runs import metric_keys as mk

L0 = 3.5
# progress 0 at the bigram level 3.1, 1 at the floor 0.9: a run trains (progress >= 0.5) below 2.0
REFS = References(floor=0.9, unigram=3.45, bigram=3.1, log_vocab=math.log(32), reference=None, l0=L0)
GRID = [1e-4, 5e-4, 2.5e-3, 1.2e-2, 6e-2, 3e-1]
FIXES = {"sqrt": {"model.scale": "sqrt"}, "inv": {"model.scale": "inv"},
         "inv_ln": {"model.scale": "inv", "model.qk_layernorm": True},
         "inv_ln_z": {"model.scale": "inv", "model.qk_layernorm": True, "train.z_loss": 1e-4},
         "softcap": {"model.scale": "sqrt", "model.logit_softcap": 50.0}}
JOB = itertools.count()


def run(fix="sqrt", d_k=64, lr=2.5e-3, seed=0, final=1.0, status="finished", attn=4.0, out=20.0,
        name="stability_fixes") -> Run:
    """One run as read from disk: final = eval/loss_as_trained (None: none), attn / out the largest attention /
    output logit it logged over training (None: not logged)."""
    config = {"name": name, "seed": seed, "data.name": "markov", "data.seq_len": 64, "model.d_k": d_k,
              "model.scale": "sqrt", "model.qk_layernorm": False, "model.logit_softcap": None,
              "model.sigma_reparam": False, "train.z_loss": 0.0, "train.lr": lr, "train.max_steps": 1000,
              **FIXES[fix]}
    summary = {mk.RUN_STATUS: status, **({mk.EVAL_LOSS_AS_TRAINED: final} if final is not None else {})}
    later = {"step": 500, **({mk.ATTN_SCORE_MAX_MAX: attn} if attn is not None else {}),
             **({mk.TRAIN_OUT_LOGIT_MAX: out} if out is not None else {})}
    return Run(Path(f"/sweeps/{name}/{next(JOB)}"), config, summary, [{"step": 0, mk.TRAIN_LOSS: L0}, later])


def v_curve(best: float, lrs=GRID) -> dict[float, float]:
    """A final loss per LR lowest at `best` (1.0), 0.3 higher a grid step away, and so on."""
    at = lrs.index(best)
    return {lr: 1.0 + 0.3 * abs(i - at) for i, lr in enumerate(lrs)}


def sweep(fix: str, best_per_dk: dict, seeds=(0, 1, 2)) -> list[Run]:
    return [run(fix, d_k, lr, seed, final=loss)
            for d_k, best in best_per_dk.items() for lr, loss in v_curve(best).items() for seed in seeds]


def cells_of(runs):
    return [cell for e in group_experiments(runs) for cell in e.cells]


def section(runs) -> str:
    return fixes_section(cells_of(runs), {"stability_fixes": REFS})


def transfer_line(text: str, fix: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {fix} |") and "**" in line)


# ------------------------------------------------------------------ the best LR and its transfer
def test_the_best_lr_is_bracketed_only_inside_the_sweep_and_where_some_lr_trains():
    groups = grouped(cells_of(sweep("sqrt", {64: 2.5e-3, 256: 1e-4, 4096: 3e-1})))
    assert best_lr(groups[("scale=sqrt ln=False", 64)], REFS) == BestLR(2.5e-3, True, "bracketed")
    assert best_lr(groups[("scale=sqrt ln=False", 256)], REFS) == BestLR(1e-4, False,
                                                                          "at the sweep's edge: not bracketed")
    assert best_lr(groups[("scale=sqrt ln=False", 4096)], REFS).votes is False
    never = grouped(cells_of([run("sqrt", 64, lr, final=3.0 + 0.1 * abs(i - 2)) for i, lr in enumerate(GRID)]))
    assert best_lr(never[("scale=sqrt ln=False", 64)], REFS) == BestLR(2.5e-3, False, "never trains")


def test_transfer_by_hand():
    b = lambda lr, votes=True: BestLR(lr, votes, "bracketed" if votes else "at the sweep's edge: not bracketed")  # noqa: E731
    same = transfer({64: b(1.2e-2), 256: b(1.2e-2), 4096: b(1.2e-2)}, GRID)
    assert same.verdict == "transfers" and "0 grid step(s) apart" in same.why
    one_step = transfer({64: b(2.5e-3), 256: b(1.2e-2), 4096: b(1.2e-2)}, GRID)
    assert one_step.verdict == "transfers" and "1 grid step(s) apart (<= 1)" in one_step.why
    two_steps = transfer({64: b(5e-4), 256: b(2.5e-3), 4096: b(1.2e-2)}, GRID)
    assert two_steps.verdict == "does not transfer" and "2 grid step(s) apart (> 1)" in two_steps.why
    # the edge does not vote: 5e-4 at 64 against 1e-4 (edge) at 4096 is one bracketed d_k alone
    edge = transfer({64: b(5e-4), 256: b(1e-4, False), 4096: b(1e-4, False)}, GRID)
    assert edge.verdict == NOT_MEASURED
    assert "d_k 256: at the sweep's edge: not bracketed" in edge.why
    # two voting d_k decide; the third, far off at the edge, is named and ignored
    two = transfer({64: b(1.2e-2), 256: b(1.2e-2), 4096: b(3e-1, False)}, GRID)
    assert two.verdict == "transfers" and "does not vote: d_k 4096" in two.why


def test_the_section_says_one_to_transfer_and_the_other_not():
    runs = sweep("inv", {64: 1.2e-2, 256: 1.2e-2, 4096: 1.2e-2}) + sweep("sqrt", {64: 1.2e-2, 256: 2.5e-3, 4096: 5e-4})
    text = section(runs)
    assert "**transfers**: best LR 0.012 at d_k 64, 0.012 at d_k 256, 0.012 at d_k 4096" in \
        transfer_line(text, "scale=inv ln=False")
    assert "**does not transfer**: best LR 0.012 at d_k 64, 0.0025 at d_k 256, 0.0005 at d_k 4096: 2 grid step(s)" \
        in transfer_line(text, "scale=sqrt ln=False")


def test_a_best_lr_at_the_edge_reads_not_bracketed():
    text = section(sweep("inv", {64: 1.2e-2, 256: 3e-1, 4096: 3e-1}))
    assert "| 0.3 (at the sweep's edge: not bracketed) |" in text
    assert ("**not measured**: fewer than two d_k with a bracketed best LR; does not vote: d_k 256: at the sweep's "
            "edge: not bracketed, d_k 4096: at the sweep's edge: not bracketed") in \
        transfer_line(text, "scale=inv ln=False")


# ------------------------------------------------------------------ LR sensitivity of one setting
def test_lr_sensitivity_of_a_hand_made_curve():
    """Three LRs, each seed ending 1.0, 2.5, diverged (l_0 = 3.5): mean of [0, 1.5, 2.5] = 4/3."""
    runs = [run("softcap", 64, lr, seed, final=loss, status=status) for seed in range(3)
            for lr, loss, status in ((1e-3, 1.0, "finished"), (1e-2, 2.5, "finished"), (1e-1, None, "diverged"))]
    text = section(runs)
    row = next(line for line in text.splitlines() if line.startswith("| scale=sqrt ln=False softcap=50 | 64 |"))
    assert f"| {4 / 3:.4g} ± 0 (n=3;" in row
    assert "| 1.000 | 2.500 | 3.500 |" in row  # the curve, the diverged LR at l_0
    assert "| 0.001 | 0.001 (at the sweep's edge: not bracketed) |" in row  # the only LR that trains (loss <= 2.0)


# ------------------------------------------------------------------ the output side and z-loss
@pytest.mark.parametrize("made,side", [
    (dict(final=1.0), TRAINS),
    (dict(final=3.4, attn=2.0e4, out=300.0), ATTENTION),  # attention logits grew: attention side first
    (dict(final=3.4, attn=3.0, out=300.0), OUTPUT),  # attention small, output logits large
    (dict(final=None, status="diverged", attn=1.0, out=float("inf")), OUTPUT),
    (dict(final=3.4, attn=3.0, out=40.0), NEITHER),
    (dict(final=3.4, attn=3.0, out=None), NOT_MEASURED),  # runs from before the output instruments
    (dict(final=3.4, attn=None, out=300.0), NOT_MEASURED),
])
def test_failure_side_by_hand(made, side):
    assert failure_side(run("inv_ln", **made), REFS, mk.ATTN_SCORE_MAX_MAX) == side


def output_failures(fix: str, n: int, out=300.0) -> list[Run]:
    """inv + QK-LayerNorm at lr 0.3 and 0.06, 3 seeds each: the first n fail on the output side, the rest train."""
    runs = [run(fix, 4096, lr, seed) for lr in (6e-2, 3e-1) for seed in range(3)]
    for r in runs[:n]:
        r.summary[mk.EVAL_LOSS_AS_TRAINED] = 3.45
        r.records[1][mk.ATTN_SCORE_MAX_MAX] = 1.0
        if out is None:
            del r.records[1][mk.TRAIN_OUT_LOGIT_MAX]
        else:
            r.records[1][mk.TRAIN_OUT_LOGIT_MAX] = out
    if out is None:
        for r in runs:
            r.records[1].pop(mk.TRAIN_OUT_LOGIT_MAX, None)
    return runs


def z_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("- z-loss"))


def test_z_loss_removes_the_output_side_failures():
    text = section(output_failures("inv_ln", 3) + output_failures("inv_ln_z", 0))
    assert z_line(text) == ("- z-loss on `scale=inv ln=True`: **removes** the output-side failures: 3 of 6 runs fail "
                            "on the output side with z-loss off, 0 of 6 with `scale=inv ln=True z_loss=0.0001`")
    assert "d_k 4096 lr 0.06: 3" in text  # where they failed


def test_z_loss_that_does_not_remove_them():
    text = section(output_failures("inv_ln", 3) + output_failures("inv_ln_z", 2))
    assert "**does not remove** the output-side failures: 3 of 6 runs" in z_line(text)
    assert "2 of 6 with `scale=inv ln=True z_loss=0.0001`" in z_line(text)


def test_z_loss_not_measured_without_output_instruments_or_without_a_z_loss_arm():
    text = section(output_failures("inv_ln", 3, out=None) + output_failures("inv_ln_z", 0, out=None))
    assert z_line(text) == ("- z-loss on `scale=inv ln=True`: **not measured** (failed runs whose attention or output "
                            "logits were not logged: 3 of `scale=inv ln=True`, 0 of `scale=inv ln=True z_loss=0.0001`)")
    assert z_line(section(output_failures("inv_ln_z", 0))) == \
        "- z-loss on `scale=inv ln=True`: **not measured** (no run of `scale=inv ln=True` without z-loss)"
    no_arm = section(output_failures("inv_ln", 3))
    assert z_line(no_arm) == "- z-loss: **not measured**: no run among these set train.z_loss"


def test_no_stability_fixes_runs_is_not_measured():
    text = fixes_section(cells_of([run(name="lr_sensitivity", lr=lr) for lr in GRID]), {})
    assert "**not measured**: no `stability_fixes` runs" in text


def test_the_growth_section_keeps_a_fix_added_to_the_divisor_apart_from_the_divisor():
    """Pooled with extras (one setup), the soft-capped cells are their own row, not the plain sqrt row's."""
    runs = [run(fix, 4096, lr, name=name) for fix, name in (("sqrt", "extras"), ("softcap", "stability_fixes"))
            for lr in GRID]
    assert sorted(growth.grouped(cells_of(runs))) == [(4096, "scale=sqrt ln=False"),
                                                      (4096, "scale=sqrt ln=False softcap=50")]


# ------------------------------------------------------------------ boundaries and the section's tables
def tables(text: str) -> dict[str, list[dict[str, str]]]:
    """The section's markdown tables, each as rows of {column: cell}, by its first column's header; every table
    line a well-formed row (`| a | b |`)."""
    found, block = {}, []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if block:
            assert all(row.startswith("| ") or row.startswith("|-") for row in block) and \
                all(row.endswith("|") for row in block), block
            header = [c.strip() for c in block[0].strip("|").split(" | ")]
            assert set(block[1]) == {"|", "-"}, block[1]
            rows = [dict(zip(header, (c.strip() for c in row.strip("|").split(" | ")))) for row in block[2:]]
            found.setdefault(header[0] + " " + header[1], rows)
            block = []
    return found


def test_no_runs_and_no_known_loss_do_not_vote_and_three_lrs_can_bracket():
    assert best_lr({}, REFS) == BestLR(None, False, "no runs")
    unknown = [run("sqrt", 64, lr, final=None) for lr in GRID[:3]]
    for r in unknown:
        r.records.pop(0)  # no step-0 loss either: nothing stands for the missing final loss
    assert best_lr(grouped(cells_of(unknown))[("scale=sqrt ln=False", 64)], REFS) == \
        BestLR(None, False, "no known loss")
    three = [run("sqrt", 64, lr, seed, final=loss) for lr, loss in zip(GRID[1:4], (1.3, 1.0, 1.3)) for seed in range(3)]
    assert best_lr(grouped(cells_of(three))[("scale=sqrt ln=False", 64)], REFS) == BestLR(2.5e-3, True, "bracketed")


def test_every_d_k_voting_names_no_silent_one():
    b = BestLR(1.2e-2, True, "bracketed")
    assert "does not vote" not in transfer({64: b, 256: b}, GRID).why


@pytest.mark.parametrize("attn,out,side", [
    (100.0, 300.0, OUTPUT),  # at ATTN_LARGE: not exceeded, so the output side
    (100.0, 100.0, OUTPUT),  # an output logit that reached OUT_LARGE
    (100.0, 99.9, NEITHER),
    (100.1, 300.0, ATTENTION),
])
def test_failure_side_at_its_lines(attn, out, side):
    assert failure_side(run("inv_ln", final=3.4, attn=attn, out=out), REFS, mk.ATTN_SCORE_MAX_MAX) == side


def test_sides_count_each_side_and_place_only_the_output_side_failures():
    groups = grouped(cells_of(output_failures("inv_ln", 3)))
    s = sides(groups, "scale=inv ln=True", REFS, mk.ATTN_SCORE_MAX_MAX)
    assert s.counts == {OUTPUT: 3, TRAINS: 3} and s.measured == 6
    assert s.output_at == {(4096, 6e-2): 3}


def test_z_loss_with_no_output_side_failures_either_way_has_nothing_to_remove():
    text = section(output_failures("inv_ln", 0) + output_failures("inv_ln_z", 0))
    assert z_line(text) == ("- z-loss on `scale=inv ln=True`: **nothing to remove**: 0 of 6 runs fail on the output "
                            "side with z-loss off, 0 of 6 with `scale=inv ln=True z_loss=0.0001`")


def test_two_z_loss_fixes_get_one_statement_each():
    plain_z = output_failures("inv_ln_z", 0)
    for r in plain_z:
        r.config["model.qk_layernorm"] = False
    text = section(output_failures("inv_ln", 3) + output_failures("inv_ln_z", 0) + plain_z)
    lines = [line for line in text.splitlines() if "z-loss on" in line]
    assert len(lines) == 2 and all(line.startswith("- z-loss on `") for line in lines)
    assert lines[0] == ("- z-loss on `scale=inv ln=False`: **not measured** (no run of `scale=inv ln=False` without "
                        "z-loss)")
    assert lines[1].startswith("- z-loss on `scale=inv ln=True`: **removes**")


def three_rows() -> list[Run]:
    """sqrt at d_k 64 over the whole grid (best 2.5e-3); inv at d_k 64 (best 2.5e-3) and 256 (never trains, final
    3.0) without the largest LR; softcap at d_k 64, also without it, with no known loss (no final loss, no step-0
    loss)."""
    runs = sweep("sqrt", {64: 2.5e-3})
    runs += [run("inv", 64, lr, seed, final=loss)
             for lr, loss in v_curve(2.5e-3, GRID[:5]).items() for seed in range(3)]
    runs += [run("inv", 256, lr, seed, final=3.0) for lr in GRID[:5] for seed in range(3)]
    unknown = [run("softcap", 64, lr, seed, final=None) for lr in GRID[:5] for seed in range(3)]
    for r in unknown:
        r.records.pop(0)
    return runs + unknown


def test_the_section_tables_by_hand():
    text = section(three_rows())
    assert text.startswith("## Every fix at every d_k\n\n")
    found = tables(text)
    main = {(r["fix"], r["d_k"]): r for r in found["fix d_k"]}
    shared = "LR sensitivity over lr 0.0001, 0.0005, 0.0025, 0.012, 0.06"  # the LRs every row ran
    sqrt = main[("scale=sqrt ln=False", "64")]
    assert [sqrt[f"loss at lr={lr:g}"] for lr in GRID] == ["1.600", "1.300", "1.000", "1.300", "1.600", "1.900"]
    assert sqrt["LRs that train"] == "0.0001, 0.0005, 0.0025, 0.012, 0.06, 0.3"
    assert sqrt["best LR"] == "0.0025 (bracketed)"
    assert sqrt[shared].startswith("0.36 ± 0 (n=3;")  # (0.6 + 0.3 + 0 + 0.3 + 0.6) / 5, not over 0.3 as well
    inv = main[("scale=inv ln=False", "256")]
    assert inv["loss at lr=0.3"] == "-" and inv["loss at lr=0.06"] == "3.000"
    assert inv["LRs that train"] == "none" and inv["best LR"] == "0.0001 (never trains)"
    assert inv[shared].startswith("never trains: not ranked (0 ± 0 (n=3;")
    assert main[("scale=sqrt ln=False softcap=50", "64")]["best LR"] == "-"
    transfer_rows = {r["fix"]: r for r in found["fix best LR, d_k 64"]}
    assert transfer_rows["scale=inv ln=False"]["best LR, d_k 64"] == "0.0025"
    assert transfer_rows["scale=inv ln=False"]["best LR, d_k 256"] == "0.0001"
    assert transfer_rows["scale=sqrt ln=False"]["best LR, d_k 256"] == "-"  # sqrt did not run d_k 256
    assert transfer_rows["scale=sqrt ln=False softcap=50"]["best LR, d_k 64"] == "-"  # no known loss
    assert transfer_rows["scale=sqrt ln=False"]["the best LR transfers across d_k"].startswith("**not measured**")
    side_rows = {r["fix"]: r for r in found["fix runs read"]}
    assert side_rows["scale=inv ln=False"] == {
        "fix": "scale=inv ln=False", "runs read": "30", "train": "15", "fail: attention side": "0",
        "fail: output side": "0", "fail: neither": "15", "not measured": "0", "output-side failures at": "-"}
    sqrt_sides = side_rows["scale=sqrt ln=False"]
    assert sqrt_sides["train"] == "18" and sqrt_sides["fail: neither"] == "0"
    assert f"with the largest attention logit, max over heads and layers (`{mk.ATTN_SCORE_MAX_MAX}`)" in text


def test_without_levels_passed_the_section_reads_them_from_its_runs():
    runs = three_rows()
    for r in runs:
        r.summary.update({mk.EVAL_FLOOR: REFS.floor, mk.DATA_UNIGRAM_XENT: REFS.unigram,
                          mk.DATA_BIGRAM_XENT: REFS.bigram, mk.DATA_LOG_VOCAB: REFS.log_vocab})
    assert fixes_section(cells_of(runs)) == section(runs)


def test_no_stability_fixes_runs_names_the_script_to_run():
    text = fixes_section(cells_of([run(name="lr_sensitivity", lr=lr) for lr in GRID]), {})
    assert "run `experiments/stability_fixes.sh` and pass its sweep directory" in text


def test_output_side_failures_are_placed_at_each_d_k_and_lr_and_all_voting_d_k_leave_nothing_unsaid():
    text = section(output_failures("inv_ln", 4))  # 3 at lr 0.06, 1 at lr 0.3
    row = next(r for r in tables(text)["fix runs read"] if r["fix"] == "scale=inv ln=True")
    assert row["output-side failures at"] == "d_k 4096 lr 0.06: 3, d_k 4096 lr 0.3: 1"
    b = BestLR(1.2e-2, True, "bracketed")
    assert transfer({64: b, 256: b}, GRID).why == ("best LR 0.012 at d_k 64, 0.012 at d_k 256: 0 grid step(s) apart "
                                                   "(<= 1)")
