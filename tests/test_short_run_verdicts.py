"""A verdict row that rests on runs too short to judge training says so in the row (C7 on 20-step runs)."""

from __future__ import annotations

import itertools
from pathlib import Path

from andrea_exp.report import screen, verdicts
from andrea_exp.report.cells import group_experiments
from andrea_exp.report.claims.c7 import c7_leak
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import MIN_STEPS
from andrea_exp.runs import metric_keys as mk

JOB = itertools.count()
TEXT = {mk.DATA_BIGRAM_XENT: 2.5, mk.DATA_UNIGRAM_XENT: 3.3, mk.DATA_LOG_VOCAB: 5.0}


def run(seed: int, causal: bool, max_steps: int) -> Run:
    """A finished text run with no leak: both twins train (2.0, below the bigram level); generation matches."""
    config = {"seed": seed, "name": "leak", "data.name": "text", "data.seq_len": 64, "model.d_k": 64,
              "model.scale": "sqrt", "model.causal": causal, "model.qk_init": "unit", "model.qk_layernorm": False,
              "train.lr": 3e-3, "train.max_steps": max_steps}
    summary = {mk.RUN_STATUS: "finished", **TEXT, mk.EVAL_LOSS_AS_TRAINED: 2.0 + 0.01 * seed,
               mk.EVAL_LOSS_GENERATION: 2.0}
    return Run(Path(f"/sweeps/leak/{next(JOB)}"), config, summary, [{"step": 0, mk.TRAIN_LOSS: 5.0}])


def c7_row(max_steps: int) -> str:
    runs = [run(seed, causal, max_steps) for seed in range(3) for causal in (True, False)]
    stmt = c7_leak(verdicts.Cells.of([c for e in group_experiments(runs) for c in e.cells]))
    return next(line for line in screen.verdict_table([stmt]).splitlines() if line.startswith("| C7 |"))


def test_the_c7_row_says_when_its_runs_are_too_short():
    short = c7_row(20)
    assert f"| **does not hold** (runs under {MIN_STEPS} steps: too short to judge) |" in short
    long = c7_row(MIN_STEPS)
    assert "| **does not hold** |" in long and "too short" not in long
