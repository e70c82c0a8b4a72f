"""experiments/chapter_scale.sh: stages checked before any work, prepare is a no-op on prepared tokens, the
report stage's one-line refusal when the runs are missing, and a stage that finished is skipped on the next
call (a session's wall time recorded per stage) while one that did not is run again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "chapter_scale.sh"


def chapter_scale(*stages: str, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), *stages], env=env, capture_output=True, text=True, timeout=120)


def test_an_unknown_stage_is_refused_before_any_stage_runs(tmp_path):
    done = chapter_scale("prepare", "bogus", SWEEPS=str(tmp_path / "sw"), TOKENS=str(tmp_path / "tok"))
    assert done.returncode == 2
    assert "unknown stage: bogus (prepare calibrate runs runs4096 small reference report)" in done.stderr
    assert not (tmp_path / "tok").exists()  # prepare never started


def test_prepare_leaves_prepared_tokens_alone(tmp_path):
    tokens = tmp_path / "tok"
    tokens.mkdir()
    (tokens / "meta.json").write_text("{}")
    done = chapter_scale("prepare", SWEEPS=str(tmp_path / "sw"), TOKENS=str(tokens))
    assert done.returncode == 0 and f"tokens ready in {tokens}" in done.stdout
    assert sorted(p.name for p in tokens.iterdir()) == ["meta.json"]


def test_the_report_stage_names_what_it_needs(tmp_path):
    (tmp_path / "sw").mkdir()
    done = chapter_scale("report", SWEEPS=str(tmp_path / "sw"), RESULTS=str(tmp_path / "out"))
    assert done.returncode != 0
    assert "needs runs*/ (experiment=claims_120m) and small/ (claims_grid)" in done.stderr


# one tiny CPU cell of the runs4096 stage (the command line's later d_k wins over the stage's 4096)
TINY_STAGE = ("model=andrea_tiny model.d_k=8 data.seq_len=16 model.block_size=16 data.vocab_size=64 "
              "data.eval_sequences=4 train.batch_size=4 train.max_steps=3 train.eval_every=0 train.attn_stats=off "
              "train.device=cpu probe.every=0 probe.dense_until=0 seed=0 model.scale=true train.sample_tokens=2 "
              "logger.mode=disabled")


def tokens_dir(path: Path) -> Path:
    import numpy as np

    path.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 64, size=4000).astype("<u2").tofile(path / "train.bin")
    rng.integers(0, 64, size=1000).astype("<u2").tofile(path / "val.bin")
    return path


def test_a_finished_stage_is_skipped_and_an_unfinished_one_runs_again(tmp_path):
    import sys

    sweeps, env = tmp_path / "sw", {"PYTHON": sys.executable, "EXTRA": TINY_STAGE, "WANDB_MODE": "disabled"}
    failed = chapter_scale("runs4096", SWEEPS=str(sweeps), TOKENS=str(tmp_path / "missing"), **env)
    assert failed.returncode == 0 and "stage runs4096:" in failed.stdout and "exit 0" not in failed.stdout
    assert not (sweeps / "runs4096.done").exists()  # no tokens: the stage did not finish, so it is not done

    tokens = tokens_dir(tmp_path / "tok")
    first = chapter_scale("runs4096", SWEEPS=str(sweeps), TOKENS=str(tokens), **env)
    assert "stage runs4096:" in first.stdout and "exit 0" in first.stdout, first.stdout + first.stderr
    assert (sweeps / "runs4096" / "0" / "summary.json").is_file()
    again = chapter_scale("runs4096", SWEEPS=str(sweeps), TOKENS=str(tokens), **env)
    assert again.stdout.startswith(f"stage runs4096: done (rm {sweeps}/runs4096.done to run it again)")
    times = [line.split("\t") for line in (sweeps / "stages.tsv").read_text().splitlines()]
    assert [(t[0], t[2]) for t in times][1:] == [("runs4096", "0")]  # the skipped call added no line
    assert len(times) == 2 and times[0][2] != "0"  # the failed call's line, then the finished one's
