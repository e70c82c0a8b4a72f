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
    pack = tmp_path / "out" / "runs.tar.xz"  # the suffix picks xz
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


def stand_in_python(tmp_path: Path, stopped: str = "") -> tuple[Path, Path]:
    """An interpreter that records each `-m andrea_exp` sweep instead of training (everything else is real
    Python); the sweep named `stopped` exits 130, as a sweep stopped by Ctrl-C does."""
    import sys

    record = tmp_path / "sweeps.log"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m andrea_exp" ]; then
  for a in "$@"; do case $a in hydra.sweep.dir=*) name=${{a##*/}};; esac; done
  echo "start $name $(date +%s.%N)" >> {record}; sleep 1; echo "end $name $(date +%s.%N)" >> {record}
  [ "$name" = "{stopped}" ] && exit 130; exit 0
fi
if [ "$1 $2" = "-m andrea_exp.report" ]; then echo report >> {record}; exit 0; fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    return fake, record


def test_lanes_run_every_stage_once_and_side_by_side(tmp_path):
    """LANES=2: the two lanes start together and together run each of the eight sweeps once."""
    fake, record = stand_in_python(tmp_path)
    done = subprocess.run(["bash", str(REPRODUCE)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LANES": "2", "PYTHON": str(fake), "SWEEPS": str(tmp_path / "sw"),
                               "RESULTS": str(tmp_path / "res")})
    assert done.returncode == 0, done.stderr
    assert "(2 lanes, 12 cells at a time in each)" in done.stdout
    events = [line.split() for line in record.read_text().splitlines() if line != "report"]
    starts = {name: float(t) for kind, name, t in events if kind == "start"}
    ends = {name: float(t) for kind, name, t in events if kind == "end"}
    assert sorted(starts) == sorted(["scaling_at_init", "claims_grid_seed0", "claims_grid_seed12", "qk_init",
                                     "leak_gap", "lr_sensitivity", "extras_inv", "extras_qkln"])
    assert len(events) == 16  # each once
    assert starts["lr_sensitivity"] < ends["scaling_at_init"] and starts["scaling_at_init"] < ends["lr_sensitivity"]


def test_a_bad_lanes_value_is_one_line_naming_the_choices(tmp_path):
    done = reproduce(LANES="3", SWEEPS=str(tmp_path / "sweeps"))
    assert done.returncode == 2
    assert done.stderr.strip() == "LANES must be 1 or 2; got '3'"
    assert not (tmp_path / "sweeps").exists()


def stopped_run(tmp_path: Path, lanes: str, stage: str) -> tuple[subprocess.CompletedProcess, list[str], str]:
    """The whole script with `stage` exiting 130: (the run, the sweeps started in order, the record)."""
    fake, record = stand_in_python(tmp_path, stopped=stage)
    done = subprocess.run(["bash", str(REPRODUCE)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LANES": lanes, "PYTHON": str(fake), "SWEEPS": str(tmp_path / "sw"),
                               "RESULTS": str(tmp_path / "res")})
    text = record.read_text()
    return done, [line.split()[1] for line in text.splitlines() if line.startswith("start")], text


def test_a_stage_stopped_by_a_signal_stops_the_script_with_its_code(tmp_path):
    """Ctrl-C stops the running sweep cleanly (it exits 130): no later stage and no report follow it."""
    done, started, record = stopped_run(tmp_path, "1", "claims_grid_seed0")
    assert done.returncode == 130, done.stderr
    assert started == ["scaling_at_init", "claims_grid_seed0"]
    assert "report" not in record
    assert "stage claims_grid_seed0 stopped by a signal (exit 130)" in done.stderr


def test_a_lane_stopped_by_a_signal_stops_the_script_before_the_report(tmp_path):
    done, started, record = stopped_run(tmp_path, "2", "lr_sensitivity")
    assert done.returncode == 130, done.stderr
    assert "extras_inv" not in started  # lane A stopped after its first stage
    assert "report" not in record


def arg_recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """An interpreter that makes each sweep's directory and records its arguments instead of training."""
    import sys

    record = tmp_path / "args.log"
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
if [ "$1 $2" = "-m andrea_exp" ]; then
  for a in "$@"; do case $a in hydra.sweep.dir=*) mkdir -p "${{a#hydra.sweep.dir=}}";; esac; done
  echo "$*" >> {record}; exit 0
fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    return fake, record


def test_a_stage_run_again_resumes_its_sweep(tmp_path):
    """A second run of a stage over the same SWEEPS resumes it (a plain rerun would be refused as an overwrite)."""
    fake, record = arg_recording_python(tmp_path)
    for _ in range(2):
        done = reproduce("leak_gap", PYTHON=str(fake), SWEEPS=str(tmp_path / "sw"))
        assert done.returncode == 0, done.stderr
    first, second = record.read_text().splitlines()
    assert "train.resume=true" not in first.split() and "train.resume=true" in second.split()


def test_the_corpus_study_runs_its_three_studies_on_the_text(tmp_path):
    fake, record = arg_recording_python(tmp_path)
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be " * 100)
    done = subprocess.run(["bash", str(REPRODUCE)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LANES": "1", "PYTHON": str(fake), "SWEEPS": str(tmp_path / "sw"),
                               "RESULTS": str(tmp_path / "res"), "CORPUS": str(corpus), "REPORT": "0"})
    assert done.returncode == 0, done.stderr
    sweeps = record.read_text().splitlines()
    assert [a.split("experiment=")[1].split()[0] for a in sweeps] == [
        "claims_grid", "claims_grid", "lr_sensitivity", "extras", "extras"]
    assert all("data=text" in a.split() and f"data.path={corpus}" in a.split() for a in sweeps)
    bad = reproduce(CORPUS=str(tmp_path / "missing.txt"), SWEEPS=str(tmp_path / "sw2"))
    assert bad.returncode == 2 and "CORPUS must be a readable text file" in bad.stderr
