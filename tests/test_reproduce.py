"""experiments/reproduce.sh: the stages it knows, and `pack` (the raw runs without checkpoints)."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

REPRODUCE = Path(__file__).resolve().parent.parent / "experiments" / "reproduce.sh"


def reproduce(*stages: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPRODUCE), *stages], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=60)


def test_pack_keeps_the_runs_and_leaves_out_checkpoints(tmp_path):
    run = tmp_path / "sweeps" / "claims_grid_seed0" / "3"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    for name in ("metrics.jsonl", "summary.json", ".hydra/overrides.yaml", "checkpoints/latest.pt"):
        (run / name).write_text("x")
    (tmp_path / "sweeps" / "wall_times.jsonl").write_text("{}\n")
    pack = tmp_path / "out" / "runs.tar.gz"
    done = reproduce("pack", SWEEPS=str(tmp_path / "sweeps"), PACK=str(pack))
    assert done.returncode == 0, done.stderr
    with tarfile.open(pack) as tar:
        files = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert files == ["sweeps/claims_grid_seed0/3/.hydra/overrides.yaml", "sweeps/claims_grid_seed0/3/metrics.jsonl",
                     "sweeps/claims_grid_seed0/3/summary.json", "sweeps/wall_times.jsonl"]


def test_an_unknown_stage_is_one_line_naming_the_stages(tmp_path):
    done = reproduce("pack", "claims", SWEEPS=str(tmp_path / "sweeps"), PACK=str(tmp_path / "p.tar.gz"))
    assert done.returncode != 0
    assert done.stderr.strip() == ("unknown stage: claims (scaling_at_init claims_grid qk_init leak_gap "
                                   "lr_sensitivity extras pack)")
    assert not (tmp_path / "p.tar.gz").exists()  # checked before any stage ran, pack included
