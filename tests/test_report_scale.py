"""The chapter-scale comparison: places of the two models paired whatever their init and LR, one-sided places
shown as missing on the other side, effects that must hold along printed with their own decision, steady
tokens/s past the warm-up window, and the whole page from hand-made runs."""

from __future__ import annotations

from andrea_exp.report import scale
from andrea_exp.report.effects import Effect, Place
from andrea_exp.runs import metric_keys as mk
from tests.test_report_effects import make_run, spread


def grid(name, qk_init, lr, d_ks, final_unscaled):
    """2 seeds of d_k x scale x mask; the unscaled cells stay at final_unscaled, the scaled ones train to 2.0."""
    runs = []
    for seed in (0, 1):
        for d_k in d_ks:
            for scale_mode in ("sqrt", "none"):
                for causal in (True, False):
                    final = 2.0 if scale_mode == "sqrt" else final_unscaled
                    final = final - (0.0 if causal else 1.0) + spread(0.0, seed)
                    run = make_run(seed, name=name, d_k=d_k, scale=scale_mode, causal=causal, qk_init=qk_init,
                                   lr=lr, final=final, generation=final + 2.0, l0=5.0)
                    run.config.update({"data.seq_len": 64, "train.batch_size": 4, "model.name": name})
                    run.summary[mk.TRAIN_TOKENS_PER_S] = 1.0
                    runs.append(run)
    return runs


def test_places_pair_across_init_and_lr_and_one_sided_places_show_a_dash():
    large = scale.statements(grid("claims_120m", "gpt2", 6e-4, (64, 256), 4.0))
    small = scale.statements(grid("claims_grid", "unit", 3e-3, (64, 256, 4096), 4.0))
    rows = [r for r in scale.comparison_rows(large, small) if r[0] == "C4b"]
    by_place = {r[1]: r for r in rows}
    assert set(by_place) == {"d_k 64", "d_k 256", "d_k 4096"}  # init and lr left out of the key
    assert by_place["d_k 64"][3] != "-" and by_place["d_k 64"][4] != "-"
    assert by_place["d_k 4096"][3] == "-" and by_place["d_k 4096"][4] != "-"  # measured on the small model only


def test_an_effect_that_must_hold_along_is_printed_with_its_decision():
    main = Effect("leak", {0: 1.0, 1: 1.1}, low=0.1)
    along = Effect("generation - unigram", {0: -1.0, 1: -1.01}, low=0.0)
    text = scale.effect_cell(Place({"d_k": 64}, main, [along]))
    assert text.startswith("1.05 [") and ": does not hold (effect holds; generation - unigram -1 [" in text
    assert scale.effect_cell(None) == "-"
    assert scale.effect_cell(Place({"d_k": 64}, main)).endswith(": holds")


def test_steady_tokens_per_s_skips_the_first_window():
    run = make_run(0)
    run.records = [{"step": s, mk.TRAIN_TOKENS_PER_S: v} for s, v in ((10, 5.0), (20, 100.0), (30, 110.0),
                                                                      (40, 90.0))]
    assert scale.steady_tokens_per_s(run) == 100.0  # the capture window (5.0) left out
    run.records = []
    assert scale.steady_tokens_per_s(run) is None


def test_the_page_has_each_section_and_states_the_conditions_that_change():
    large = grid("claims_120m", "gpt2", 6e-4, (64, 256), 4.0)
    small = grid("claims_grid", "unit", 3e-3, (64, 256, 4096), 4.0)
    lrs = [make_run(0, name="claims_120m", lr=lr, final=f) for lr, f in ((3e-4, 3.1), (6e-4, 3.0))]
    for r, values in zip(lrs, ((3.5, 3.1), (3.4, 3.0))):
        r.records += [{"step": 50 * (i + 1), mk.EVAL_LOSS_AS_TRAINED: v} for i, v in enumerate(values)]
    page = scale.render(large, small, lrs=lrs, machine="one test GPU")
    for heading in ("## Conditions that change", "## Verdicts", "## Effects, place by place", "## Cost on one GPU",
                    "### LR scan"):
        assert heading in page
    assert "16 runs of ANDREA-120M (16 finished) and 24 of the small model on one test GPU" in page
    assert "| model.qk_init | gpt2 | unit |" in page and "| train.lr | 0.0006 | 0.003 |" in page
    assert "| 0.0006 | 1000 | 3.400 / 3.000 | 3.0000 |" in page
    assert "### Step time" not in page  # no calibration runs given
