"""experiments/chapter_scale.sh: stages checked before any work, prepare is a no-op on prepared tokens, and the
report stage's one-line refusal when the runs are missing."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "chapter_scale.sh"


def chapter_scale(*stages: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *stages], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=120)


def test_an_unknown_stage_is_refused_before_any_stage_runs(tmp_path):
    done = chapter_scale("prepare", "bogus", SWEEPS=str(tmp_path / "sw"), TOKENS=str(tmp_path / "tok"))
    assert done.returncode == 2
    assert "unknown stage: bogus (prepare calibrate runs small reference report)" in done.stderr
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
