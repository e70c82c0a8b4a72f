"""The training controls, read from what a run writes: gradient clipping, the LR schedule, the token count.

Each test runs `andrea_exp.training.loop.train` on a tiny CPU configuration composed from conf/ and reads the run's
metrics.jsonl (and, for the optimiser's first moment, its final checkpoint), so the tests hold whatever
the inside of train.py looks like. Expected values are computed by hand here, never read from the code.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import compose_tiny, probe_settings

from andrea_exp.config.validation import validate
from andrea_exp.runs.rundir import read_metrics
from andrea_exp.training.loop import train

SMALLER = ("train.device=cpu", "model.d_model=16", "model.n_head=2", "model.d_k=8", "model.d_v=8", "model.block_size=8",
           "data.seq_len=8", "data.eval_sequences=4", "train.batch_size=4", "train.eval_every=0",
           "train.sample_tokens=2")


def run(tmp_path: Path, *overrides: str) -> tuple[dict[int, dict], Path]:
    """Train the tiny preset with SMALLER and OVERRIDES; return {step: every train/* and grad/* value logged at that
    step}, run dir."""
    cfg = compose_tiny(*SMALLER, *overrides)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    summary = train(validate(cfg), run_dir)
    assert summary["run/status"] == "finished"
    by_step: dict[int, dict] = {}
    for record in read_metrics(run_dir):
        by_step.setdefault(record["step"], {}).update(
            {k: v for k, v in record.items() if k.startswith(("train/", "grad/"))})
    return by_step, run_dir


def first_moment_norm(run_dir: Path) -> float:
    """Global norm of AdamW's exp_avg in the final checkpoint: after one step it is (1 - beta1) x the
    gradient the optimiser received, i.e. after clipping (Adam's update itself hides the gradient's scale)."""
    state = torch.load(run_dir / "checkpoints" / "latest.pt", map_location="cpu", weights_only=False)
    moments = [s["exp_avg"] for s in state["optimizer"]["state"].values()]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(m) for m in moments])))


def test_a_tiny_clip_clips_every_step_and_the_optimiser_gets_the_clipped_norm(tmp_path):
    steps, run_dir = run(tmp_path, "train.max_steps=1", "train.log_every=1", "train.grad_clip=1e-3",
                         "train.beta1=0.9")
    assert steps[0]["grad/norm"] > 1e-2  # the raw gradient is far above the clip, so clipping must act
    assert steps[0]["train/grad_clip_frac"] == 1.0
    assert first_moment_norm(run_dir) == pytest.approx((1 - 0.9) * 1e-3, rel=1e-4)


def test_grad_clip_zero_clips_nothing(tmp_path):
    steps, run_dir = run(tmp_path, "train.max_steps=1", "train.log_every=1", "train.grad_clip=0", "train.beta1=0.9")
    assert steps[0]["train/grad_clip_frac"] == 0.0
    # the whole raw gradient reaches the optimiser
    assert first_moment_norm(run_dir) == pytest.approx((1 - 0.9) * steps[0]["grad/norm"], rel=1e-4)


def test_grad_clip_frac_is_the_share_of_the_window_above_the_clip(tmp_path):
    # a clip inside the range of this run's gradient norms, so windows hold both kinds of step
    clip = 1.2
    steps, _ = run(tmp_path, "train.max_steps=12", "train.log_every=4", f"train.grad_clip={clip}")
    windows = [range(0, 4), range(4, 8), range(8, 12)]
    fractions = []
    for window in windows:
        logged_at = window[-1]
        assert "train/grad_clip_frac" in steps[logged_at]
        assert all("train/grad_clip_frac" not in steps[s] for s in window[:-1])  # once per window, at its end
        expected = sum(steps[s]["grad/norm"] > clip for s in window) / len(window)
        assert steps[logged_at]["train/grad_clip_frac"] == pytest.approx(expected)
        fractions.append(expected)
    assert any(0 < f < 1 for f in fractions), f"the clip should split some window; fractions {fractions}"


def test_lr_warmup_ramp_then_cosine_to_the_floor(tmp_path):
    lr, ratio, warmup, max_steps = 1e-2, 0.1, 4, 12
    steps, _ = run(tmp_path, f"train.max_steps={max_steps}", "train.log_every=4", f"train.lr={lr}",
                   f"train.min_lr_ratio={ratio}", f"train.warmup_steps={warmup}")
    logged = [steps[s]["train/lr"] for s in range(max_steps)]
    floor = lr * ratio
    by_hand = []
    for s in range(max_steps):
        if s < warmup:
            by_hand.append(lr * (s + 1) / (warmup + 1))  # linear ramp from lr / (warmup + 1)
        else:
            progress = (s - warmup) / (max_steps - warmup)
            by_hand.append(floor + (lr - floor) * (1 + math.cos(math.pi * progress)) / 2)
    assert logged == pytest.approx(by_hand, rel=1e-6)
    # hand-checked anchors: 1e-2 / 5 at step 0, the peak right after warmup, then strictly decreasing
    assert logged[0] == pytest.approx(2e-3) and logged[warmup] == pytest.approx(lr)
    assert all(a > b for a, b in zip(logged[warmup:], logged[warmup + 1:]))
    assert min(logged[warmup:]) > floor


@pytest.mark.xfail(strict=True, reason="the cosine reaches lr * min_lr_ratio at step max_steps, one step after "
                                       "the last update; the last update uses a slightly higher lr")
def test_last_update_uses_the_floor_lr(tmp_path):
    steps, _ = run(tmp_path, "train.max_steps=6", "train.log_every=6", "train.lr=1e-2", "train.min_lr_ratio=0.1",
                   "train.warmup_steps=2")
    assert steps[5]["train/lr"] == pytest.approx(1e-3, rel=1e-6)


def test_lr_without_warmup_starts_at_the_peak(tmp_path):
    lr, ratio, max_steps = 1e-2, 0.5, 4
    steps, _ = run(tmp_path, f"train.max_steps={max_steps}", "train.log_every=4", f"train.lr={lr}",
                   f"train.min_lr_ratio={ratio}", "train.warmup_steps=0")
    floor = lr * ratio
    by_hand = [floor + (lr - floor) * (1 + math.cos(math.pi * s / max_steps)) / 2 for s in range(max_steps)]
    assert [steps[s]["train/lr"] for s in range(max_steps)] == pytest.approx(by_hand, rel=1e-6)


def test_tokens_count_every_sequence_of_every_step(tmp_path):
    steps, _ = run(tmp_path, "train.max_steps=5", "train.log_every=2", "train.batch_size=4", "data.seq_len=8")
    assert [steps[s]["train/tokens"] for s in range(5)] == [(s + 1) * 4 * 8 for s in range(5)]


# ---------------------------------------------------------------- the probe schedule and the divergence rule
# (pure functions: no training run needed)


def due(cadence: dict, until: int = 40) -> list[int]:
    from andrea_exp.training.loop import probe_due

    return [s for s in range(until) if probe_due(s, probe_settings(**{"every": 0, "dense_until": 0, "dense_every": 0,
                                                                      **cadence}))]


def test_no_probe_settings_means_no_probes():
    assert due({}) == []


def test_every_one_probes_every_step():
    assert due({"every": 1}, until=5) == [0, 1, 2, 3, 4]


def test_dense_settings_left_out_keep_the_plain_cadence():
    assert due({"every": 10, "dense_every": 2}) == [0, 10, 20, 30]  # no dense_until: no dense start
    assert due({"every": 10, "dense_until": 5}) == [0, 10, 20, 30]  # no dense_every: no dense start


def test_dense_every_one_probes_each_step_below_dense_until_only():
    assert due({"every": 10, "dense_until": 4, "dense_every": 1}) == [0, 1, 2, 3, 10, 20, 30]


def test_a_resume_from_a_state_without_a_streak_starts_at_zero():
    from andrea_exp.training.loop import DivergenceWatch

    watch = DivergenceWatch(factor=2.0, patience=2)
    watch.load_state({"initial_loss": 1.0})
    assert (watch.initial, watch.streak) == (1.0, 0)
    watch.check(5, 3.0, 0.5)  # one step above 2 x 1.0: a streak of 1, below patience
    assert watch.streak == 1


def test_adam_betas_and_weight_decay_come_from_the_settings():
    from andrea_exp.training.cell import build_model, build_optimizer

    cfg = compose_tiny(*SMALLER, "train.beta1=0.8", "train.beta2=0.95", "train.weight_decay=0.3")
    optimizer, _ = build_optimizer(build_model(cfg, vocab_size=16), cfg, torch.device("cpu"))
    assert all(group["betas"] == (0.8, 0.95) for group in optimizer.param_groups)
    assert sorted({group["weight_decay"] for group in optimizer.param_groups}) == [0.0, 0.3]


def test_one_warmup_step_starts_at_half_the_lr(tmp_path):
    lr, ratio, max_steps = 1e-2, 0.5, 3
    steps, _ = run(tmp_path, f"train.max_steps={max_steps}", "train.log_every=3", f"train.lr={lr}",
                   f"train.min_lr_ratio={ratio}", "train.warmup_steps=1")
    floor = lr * ratio
    # ramp: lr / (1 + 1) at step 0; then the cosine over the 2 remaining steps from the peak
    by_hand = [lr / 2, lr, floor + (lr - floor) * (1 + math.cos(math.pi / 2)) / 2]
    assert [steps[s]["train/lr"] for s in range(max_steps)] == pytest.approx(by_hand, rel=1e-6)


def test_a_fresh_divergence_watch_has_no_streak():
    from andrea_exp.training.loop import DivergenceWatch

    assert DivergenceWatch(factor=2.0, patience=3).state() == {"initial_loss": None, "diverge_streak": 0}


def test_tokens_per_s_over_a_short_window_that_starts_late():
    # a clock that does not start at 0, and a window shorter than 1 s: 2 steps x 50 tokens in 0.5 s
    try:
        from andrea_exp.training.logwindow import LogWindow
    except ImportError:
        from andrea_exp.training.loop import LogWindow
    from andrea_exp.runs import metric_keys as K

    clock = iter([100.0, 100.5, 101.0])  # start, flush, restart
    window = LogWindow(tokens_per_step=50, grad_clip=0.0, clock=lambda: next(clock))
    window.add(0, torch.tensor(1.0), torch.tensor(1.0), 0.1)
    window.add(1, torch.tensor(1.0), torch.tensor(1.0), 0.1)
    assert window.flush()[-1][1][K.TRAIN_TOKENS_PER_S] == pytest.approx(200.0)
