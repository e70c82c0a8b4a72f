""""The largest attention logit" is the maximum over heads and layers: the probe logs it, and the report reads it
(or the training batch's) wherever it says largest, naming the mean-over-heads key where runs logged no maximum."""

from __future__ import annotations

from pathlib import Path

import torch

from andrea_exp.instruments.probe import ATTN_STATS, MetricSheet, put_attention_stats
from andrea_exp.report.largest import logit_key, logit_label
from andrea_exp.report.runs import Run
from andrea_exp.runs import metric_keys as mk


def test_the_probe_logs_the_largest_logit_over_heads_and_layers_beside_the_mean():
    heads = [torch.tensor([1.0, 9.0]), torch.tensor([30.0, 2.0])]  # (H,) per layer: per-head largest logits
    forward = [{"head": {stat: (h if stat == "score_max" else torch.zeros(2)) for stat in ATTN_STATS},
                "q": torch.tensor(1.0), "k": torch.tensor(1.0)} for h in heads]
    sheet = MetricSheet()
    put_attention_stats(sheet, forward, per_head=False)
    values = sheet.to_host()
    assert values[mk.ATTN_SCORE_MAX] == (5.0 + 16.0) / 2  # mean over heads, then layers: not the largest
    assert values["attn/L0/score_max_max"] == 9.0 and values["attn/L1/score_max_max"] == 30.0
    assert values[mk.ATTN_SCORE_MAX_MAX] == 30.0


def run(*keys: str) -> Run:
    return Run(Path("/r"), {}, {"run/status": "finished"}, [{"step": 10, **{k: 1.0 for k in keys}}])


def test_the_report_reads_a_true_maximum_where_every_run_logged_one():
    assert logit_key([run(mk.ATTN_STEP_SCORE_MAX, mk.ATTN_SCORE_MAX_MAX)] * 2) == mk.ATTN_STEP_SCORE_MAX
    mixed = [run(mk.ATTN_SCORE_MAX_MAX, mk.ATTN_SCORE_MAX), run(mk.ATTN_STEP_SCORE_MAX, mk.ATTN_SCORE_MAX_MAX)]
    assert logit_key(mixed) == mk.ATTN_SCORE_MAX_MAX
    old = [run(mk.ATTN_SCORE_MAX), run(mk.ATTN_SCORE_MAX_MAX)]  # one run predates the maximum: the mean, named
    assert logit_key(old) == mk.ATTN_SCORE_MAX
    assert "max over heads and layers" in logit_label(mk.ATTN_SCORE_MAX_MAX)
    assert "mean over heads and layers" in logit_label(mk.ATTN_SCORE_MAX)
