"""The loop's parts on hand-computed cases: probe cadence, the logging window, resume state, settings, signals."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import compose_tiny, probe_settings

from andrea_exp.config.validation import ConfigError, validate
from andrea_exp.runs import metric_keys as K
from andrea_exp.runs.code_facts import code_sha, git_facts
from andrea_exp.training import checkpoint
from andrea_exp.training.interrupts import StopRequest
from andrea_exp.training.logwindow import LogWindow
from andrea_exp.training.loop import DivergenceWatch, LoopState, probe_due, train
from andrea_exp.training.runtime import Runtime, setup_runtime

LOOP = ("train.max_steps=4", "train.eval_every=0", "train.log_every=2", "train.device=cpu", "train.sample_tokens=2")


# ---------------------------------------------------------------- probe cadence


def due_steps(cadence: dict, until: int = 40) -> list[int]:
    return [s for s in range(until) if probe_due(s, probe_settings(**{"dense_until": 0, "dense_every": 0, **cadence}))]


def test_probe_cadence_without_dense_keys_is_every():
    assert due_steps({"every": 10}) == [0, 10, 20, 30]
    assert due_steps({"every": 15}) == [0, 15, 30]


def test_probe_every_zero_is_off_even_with_a_dense_start():
    assert due_steps({"every": 0, "dense_until": 10, "dense_every": 1}) == []


def test_dense_start_then_every():
    # every 2 steps below 9, then every 10: 10 is on both grids, 9 is on neither
    assert due_steps({"every": 10, "dense_until": 9, "dense_every": 2}) == [0, 2, 4, 6, 8, 10, 20, 30]


def test_dense_every_zero_keeps_the_plain_cadence():
    assert due_steps({"every": 10, "dense_until": 30, "dense_every": 0}) == [0, 10, 20, 30]


# ---------------------------------------------------------------- the logging window


def test_window_rows_clip_share_and_tokens(monkeypatch):
    window = LogWindow(tokens_per_step=100, grad_clip=1.0)
    for step, (loss, gn) in enumerate([(3.0, 0.5), (2.5, 1.5), (2.0, 1.0), (1.5, 4.0)], start=10):
        window.add(step, torch.tensor(loss), torch.tensor(gn), lr=0.1 * step)
    rows = window.flush()
    assert [at for at, _ in rows] == [10, 11, 12, 13]
    assert [r[K.TRAIN_LOSS] for _, r in rows] == [3.0, 2.5, 2.0, 1.5]
    assert [r[K.TRAIN_TOKENS] for _, r in rows] == [1100, 1200, 1300, 1400]  # tokens up to and including the step
    assert rows[1][1][K.TRAIN_LR] == pytest.approx(1.1)
    assert rows[-1][1][K.TRAIN_GRAD_CLIP_FRAC] == 0.5  # 1.5 and 4.0 exceed 1.0; 1.0 itself is not clipped
    assert all(K.TRAIN_TOKENS_PER_S not in r for _, r in rows[:-1])
    assert len(window) == 0 and window.flush() == []


def test_window_without_clipping_reports_zero_share():
    window = LogWindow(tokens_per_step=1, grad_clip=0.0)
    window.add(0, torch.tensor(1.0), torch.tensor(100.0), lr=1.0)
    assert window.flush()[0][1][K.TRAIN_GRAD_CLIP_FRAC] == 0.0


def test_tokens_per_s_leaves_out_time_set_aside():
    clock = iter([0.0, 10.0, 14.0, 20.0, 21.0])  # start, aside begins, aside ends, flush, restart
    window = LogWindow(tokens_per_step=50, grad_clip=0.0, clock=lambda: next(clock))
    window.add(0, torch.tensor(1.0), torch.tensor(1.0), 0.1)
    window.add(1, torch.tensor(1.0), torch.tensor(1.0), 0.1)
    with window.aside():
        pass
    rows = window.flush()
    assert rows[-1][1][K.TRAIN_TOKENS_PER_S] == pytest.approx(100 / (20 - 4))  # 2 steps x 50 tokens in 16 s
    assert window.started == 21.0 and window.excluded == 0.0


# ---------------------------------------------------------------- what survives a resume


def test_loop_state_round_trip_keeps_records_only_at_its_step():
    st = LoopState(DivergenceWatch(3.0, 5), step=40, best_eval=2.5, best_step=20, last={K.TRAIN_LOSS: 2.7})
    st.watch.initial, st.watch.streak = 3.3, 2
    st.records_step, st.records = 40, [{K.EVAL_LOSS_AS_TRAINED: torch.tensor(2.6)}]
    extra = st.to_checkpoint(max_steps=100, scientific={"model.d_k": 16})
    assert extra["records_at_step"] == [{K.EVAL_LOSS_AS_TRAINED: pytest.approx(2.6)}]  # tensor made plain
    back = LoopState(DivergenceWatch(3.0, 5))
    back.load_checkpoint({"step": 40, "extra": extra})
    assert (back.step, back.best_eval, back.best_step, back.last) == (40, 2.5, 20, {K.TRAIN_LOSS: 2.7})
    assert (back.watch.initial, back.watch.streak) == (3.3, 2)
    st.records_step = 39  # records of another step are not this checkpoint's
    assert st.to_checkpoint(100, {})["records_at_step"] == []


def test_settings_hold_scientific_keys_only():
    settings = checkpoint.scientific_settings(compose_tiny(*LOOP, "model.d_k=8"))
    assert settings["model.d_k"] == 8 and settings["train.lr"] == 3.0e-3
    for operational in ("seed", "logger.mode", "train.device", "train.eval_every", "probe.every", "train.resume",
                        "train.progress", "train.progress_every", "train.keep_checkpoints"):
        assert operational not in settings, operational


def test_changed_settings_are_named_in_one_line():
    saved = {"model.d_k": 16, "train.lr": 0.003, "model.causal": True}
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.check_settings(saved, {"model.d_k": 8, "train.lr": 0.003, "data.seq_len": 64}, Path("x.pt"))
    message = str(err.value)
    assert "\n" not in message  # data.seq_len has no default to assume for a checkpoint without it: unset
    assert "data.seq_len (unset) -> 64, model.causal True -> (unset), model.d_k 16 -> 8;" in message
    assert "train.lr" not in message
    checkpoint.check_settings(saved, dict(saved), Path("x.pt"))  # the same settings pass
    checkpoint.check_settings(None, saved, Path("x.pt"))  # an older checkpoint without settings passes


def test_keep_copies_keeps_the_last_n_and_the_best(tmp_path):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    contents = {}
    for step, best in [(10, True), (20, False), (30, True), (40, False)]:
        with torch.no_grad():
            model.weight.fill_(step)
        checkpoint.save(tmp_path, step=step, model=model, optimizer=opt, scheduler=sched, extra={})
        checkpoint.keep_copies(tmp_path, step, keep=2, is_best=best)
        contents[step] = (tmp_path / checkpoint.LATEST).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "latest.pt", "step-0000030.pt",
                                                          "step-0000040.pt"]
    assert (tmp_path / "best.pt").read_bytes() == contents[30]
    assert (tmp_path / "step-0000030.pt").read_bytes() == contents[30]  # not overwritten by the later saves
    assert (tmp_path / checkpoint.LATEST).read_bytes() == contents[40]


# ---------------------------------------------------------------- signals, facts, precision


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_is_a_request_and_the_second_one_gets_the_old_handler(signum):
    seen = []
    previous = signal.signal(signum, lambda s, f: seen.append(s))
    try:
        with StopRequest() as stop:
            assert not stop.agreed(Runtime(torch.device("cpu")), at_sync_point=True)
            os.kill(os.getpid(), signum)
            assert stop.signum == signum and stop.agreed(Runtime(torch.device("cpu")), at_sync_point=False)
            assert seen == []
            os.kill(os.getpid(), signum)  # a second signal reaches the handler in place before
            assert seen == [signum]
        assert signal.getsignal(signum) is not stop._handle
    finally:
        signal.signal(signum, previous)


def test_git_facts_in_and_outside_a_checkout(tmp_path):
    facts = git_facts()
    assert len(facts["run/git_commit"]) == 40 and isinstance(facts["run/git_dirty"], bool)
    assert git_facts(tmp_path) == {"run/git_commit": None, "run/git_dirty": None}


def test_fp16_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^train.precision=fp16 is refused: .*use bf16") as err:
        setup_runtime(compose_tiny(*LOOP, "train.precision=fp16"))
    assert "\n" not in str(err.value)


def test_bf16_autocast_on_cpu_trains_and_differs_from_fp32(tmp_path):
    for name in ("fp32", "bf16"):
        (tmp_path / name).mkdir()
    fp32 = train(validate(compose_tiny(*LOOP, "train.precision=fp32")), tmp_path / "fp32")
    bf16 = train(validate(compose_tiny(*LOOP, "train.precision=bf16")), tmp_path / "bf16")
    assert fp32[K.RUN_STATUS] == bf16[K.RUN_STATUS] == "finished" and bf16[K.RUN_STEPS] == 4
    assert math.isfinite(bf16[K.TRAIN_LOSS]) and math.isfinite(bf16[K.EVAL_LOSS_AS_TRAINED])
    assert bf16[K.TRAIN_LOSS] != fp32[K.TRAIN_LOSS]  # autocast took effect: bfloat16 matmuls round differently
    assert bf16[K.TRAIN_LOSS] == pytest.approx(fp32[K.TRAIN_LOSS], abs=0.05)


def test_git_facts_can_leave_out_a_directory(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "out").mkdir()
    (tmp_path / "code.py").write_text("a = 1\n")
    (tmp_path / "out" / "report.md").write_text("old\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    assert git_facts(tmp_path, ignore=tmp_path / "out")["run/git_dirty"] is False
    (tmp_path / "out" / "report.md").write_text("new\n")  # the report rewriting its own output
    assert git_facts(tmp_path)["run/git_dirty"] is True
    assert git_facts(tmp_path, ignore=tmp_path / "out")["run/git_dirty"] is False
    (tmp_path / "code.py").write_text("a = 2\n")  # the code itself edited
    assert git_facts(tmp_path, ignore=tmp_path / "out")["run/git_dirty"] is True
    assert git_facts(tmp_path, ignore=Path("/elsewhere"))["run/git_dirty"] is True  # outside: nothing left out


def test_code_sha_names_the_source_whatever_git_says(tmp_path):
    def tree(root: Path, body: str) -> tuple[Path, Path]:
        package, conf = root / "andrea_exp", root / "conf"
        (package / "report").mkdir(parents=True)
        (package / "__pycache__").mkdir()
        (conf / "model").mkdir(parents=True)
        (package / "model.py").write_text(body)
        (package / "report" / "rules.py").write_text("b = 2\n")
        (package / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\x00stale")
        (conf / "model" / "small.yaml").write_text("d_k: 64\n")
        return package, conf

    first, second = tree(tmp_path / "one", "a = 1\n"), tree(tmp_path / "two", "a = 1\n")
    sha = code_sha(*first)
    assert len(sha) == 12 and int(sha, 16) >= 0
    assert code_sha(*second) == sha  # the same source in another place
    (first[0] / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"other")
    assert code_sha(*first) == sha  # compiled caches are not source
    (second[1] / "model" / "small.yaml").write_text("d_k: 128\n")
    assert code_sha(*second) != sha  # a config is part of the code that ran
    (first[0] / "report" / "rules.py").rename(first[0] / "report" / "other.py")
    assert code_sha(*first) != sha  # so is where a file lies


def test_the_summary_says_where_the_loop_time_went(tmp_path):
    """Probes at steps 0 and 2, evaluations at 2, a checkpoint every 2: each phase took time, and the steps plus
    the phases inside the loop make up the loop's wall time."""
    cfg = compose_tiny(*LOOP, "probe.every=2", "probe.maps_every=0", "train.eval_every=2", "train.ckpt_every=2")
    summary = train(validate(cfg), tmp_path)
    t = {phase: summary[key] for phase, key in K.RUN_TIME.items()}
    assert all(t[p] > 0 for p in ("setup", "steps", "probes", "evals", "checkpoints", "end")), t
    assert t["maps"] == 0
    inside = t["steps"] + t["probes"] + t["evals"] + t["maps"] + t["checkpoints"]
    assert inside == pytest.approx(summary[K.RUN_WALL_S], rel=0.02)


# ---------------------------------------------------------------- what a run's charts start and end with


def test_evaluation_starts_at_step_0_and_the_last_step_has_an_attention_map(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = compose_tiny(*LOOP, "train.max_steps=3", "train.eval_every=2", "probe.every=2", "probe.maps_every=100")
    summary = train(validate(cfg), run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r[K.EVAL_LOSS_AS_TRAINED]) for r in records if K.EVAL_LOSS_AS_TRAINED in r]
    assert [step for step, _ in evals] == [0, 2, 3]  # before training, on the cadence, at the end
    best_step, best = min(evals, key=lambda e: e[1])
    assert summary[K.BEST_EVAL_STEP] == best_step and summary[K.BEST_EVAL_LOSS] == best
    maps = sorted(p.name for p in (run_dir / "attention_maps").iterdir())
    assert maps == ["step0000000.npz", "step0000000_L0.png",  # maps_every exceeds the run: first and last step
                    "step0000003.npz", "step0000003_L0.png"]
