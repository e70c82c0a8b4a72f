"""Passes over the training data (data/epochs) and the one-line warning of a run that repeats its data, on
hand-computed sizes and on real tiny runs; the held-in windows of eval/loss_train_split."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import compose_tiny

from andrea_exp.config.validation import validate
from andrea_exp.data.epochs import epochs, repeat_line, repeats
from andrea_exp.data.sources import build_dataset
from andrea_exp.instruments.evaluate import sequence_losses
from andrea_exp.runs import metric_keys as K
from andrea_exp.training import checkpoint
from andrea_exp.training.cell import build_model
from andrea_exp.training.loop import train

# the tiny preset: 64 training windows of T 16 = 1024 training tokens; batch 8 x 16 = 128 tokens a step
TRAIN_TOKENS, PER_STEP = 64 * 16, 8 * 16


def test_epochs_is_tokens_seen_over_training_tokens():
    assert epochs(1536, 1024) == 1.5
    assert epochs(1024, 1024) == 1.0 and not repeats(1.0)  # exactly one pass sees every window once
    assert repeats(1.0001) and not repeats(None)
    assert math.isinf(epochs(1, 0))


def test_the_repeat_line_gives_the_numbers_and_is_silent_within_one_pass():
    assert repeat_line(8, PER_STEP, TRAIN_TOKENS) is None  # 8 x 128 = 1024: one pass, nothing repeated
    line = repeat_line(12, PER_STEP, TRAIN_TOKENS)
    assert "\n" not in line
    assert "repeats its training data: 12 steps x 128 tokens = 1,536 tokens over 1,024 training tokens = 1.50 " \
           "epochs" in line


def test_a_dataset_counts_its_training_tokens(tiny_config):
    cfg = tiny_config
    data = build_dataset(cfg.data, cfg.data.seq_len, seed=0)
    assert data.train_tokens == TRAIN_TOKENS  # the built-in Markov source's split is finite: 64 windows x 16


def test_held_in_windows_are_as_many_as_the_held_out_spread_over_the_training_split(tiny_config):
    cfg = tiny_config
    data = build_dataset(cfg.data, cfg.data.seq_len, seed=0)
    held_in = data.held_in()
    assert held_in.shape == data.eval.tokens.shape  # 8 windows of 17 tokens
    assert torch.equal(held_in, data.train.tokens[torch.arange(8) * 8])  # windows 0, 8, ..., 56 of 64
    assert torch.equal(held_in, data.held_in())  # the same at every evaluation


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("steps, warned", [(12, True), (8, False)])
def test_a_run_records_its_epochs_and_warns_at_its_start_when_it_repeats(tmp_path, capsys, steps, warned):
    cfg = compose_tiny(f"train.max_steps={steps}", "train.eval_every=4", "train.device=cpu", "train.sample_tokens=2")
    summary = train(validate(cfg), tmp_path)
    out = capsys.readouterr().out
    assert summary[K.DATA_TRAIN_TOKENS] == TRAIN_TOKENS
    assert summary[K.DATA_EPOCHS] == pytest.approx(steps * PER_STEP / TRAIN_TOKENS)
    assert json.loads((tmp_path / "summary.json").read_text())[K.DATA_EPOCHS] == summary[K.DATA_EPOCHS]
    lines = [line for line in out.splitlines() if "repeats its training data" in line]
    assert len(lines) == int(warned)
    if warned:  # at the start: right after the model's line, before any step
        described = [i for i, line in enumerate(out.splitlines()) if line.startswith("[andrea-exp] model ")]
        assert out.splitlines()[described[0] + 1] == lines[0]
        assert "= 1.50 epochs" in lines[0]


def test_every_evaluation_logs_the_training_split_loss_beside_the_held_out_one(tmp_path):
    cfg = compose_tiny("train.max_steps=8", "train.eval_every=4", "train.device=cpu", "train.sample_tokens=2")
    train(validate(cfg), tmp_path)
    evals = [r for r in _records(tmp_path) if K.EVAL_LOSS_AS_TRAINED in r]
    assert [r["step"] for r in evals] == [0, 4, 8]  # evaluation at step 0 too
    assert all(K.EVAL_LOSS_TRAIN_SPLIT in r and math.isfinite(r[K.EVAL_LOSS_TRAIN_SPLIT]) for r in evals)
    # the final value is the loss of the held-in windows under the final weights
    data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed)
    model = build_model(cfg, data.vocab_size)
    state = checkpoint.load(tmp_path / "checkpoints")
    model.load_state_dict(state["model"])
    model.eval()
    expected = sequence_losses(model, data.held_in()).mean().item()
    assert evals[-1][K.EVAL_LOSS_TRAIN_SPLIT] == pytest.approx(expected, rel=1e-5)
