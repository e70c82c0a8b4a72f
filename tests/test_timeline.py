"""The command timeline: spans written only when asked, cut into parts by benchmarks/timeline.py (hand-computed
cases), and the script itself on a tiny default run."""

from __future__ import annotations

import json
import os
import sys

import pytest

from andrea_exp.runs import timeline
from benchmarks import timeline as bench


def test_spans_are_written_only_when_the_variable_names_a_file(tmp_path, monkeypatch):
    target = tmp_path / "events.jsonl"
    monkeypatch.delenv(timeline.ENV, raising=False)
    with timeline.span("quiet"):
        pass
    assert not target.exists()
    monkeypatch.setenv(timeline.ENV, str(target))
    with pytest.raises(ValueError), timeline.span("failing", cell=3):
        raise ValueError("the span is still recorded")
    timeline.mark("instant")
    events = [json.loads(line) for line in target.read_text().splitlines()]
    assert [e["name"] for e in events] == ["failing", "instant"]
    assert events[0]["cell"] == 3 and events[0]["end"] >= events[0]["start"]
    assert events[1]["start"] == events[1]["end"]


def _e(name, start, end=None, pid=1, **fields):
    return {"name": name, "pid": pid, "start": start, "end": start if end is None else end, **fields}


def test_a_sweep_is_cut_into_its_parts():
    """Launched at 100, exited at 150; two cells in worker 2 and 3, the launching process is 1."""
    phases = {"run/wall_s": 10.0, "run/time/setup_s": 4.0, "run/time/steps_s": 7.0, "run/time/probes_s": 1.0,
              "run/time/evals_s": 0.5, "run/time/maps_s": 1.5, "run/time/checkpoints_s": 0.0, "run/time/end_s": 2.0}
    events = [_e("main", 100.5), _e("imports", 100.5, 102.0), _e("sweep_start", 105.0),
              _e("train_imports", 110.0, 113.0, pid=2), _e("wandb_init", 113.5, 115.0, pid=2),
              _e("capture", 116.0, 116.5, pid=2), _e("maps_draw", 117.0, 119.0, pid=9, arrays="/s/0/maps/a.npz"),
              _e("maps_draw", 118.0, 118.25, pid=9, arrays="/s/1/maps/a.npz"),
              _e("maps_wait", 129.0, 129.5, pid=2), _e("wandb_finish", 130.0, 131.0, pid=2),
              _e("job", 110.0, 132.0, pid=2, cell=0, run_dir="/s/0", phases=phases),
              _e("job", 111.0, 140.0, pid=3, cell=1, run_dir="/s/1", phases=phases),
              _e("sweep_table", 141.0, 143.0)]
    result = bench.training_timeline(100.0, 150.0, 1, events)
    assert result["wall_s"] == 50.0
    assert result["parts"] == {"process_start_s": 0.5, "imports_s": 1.5, "hydra_compose_s": 3.0, "launch_s": 5.0,
                               "cells_s": 30.0, "sweep_table_s": 2.0, "exit_s": 7.0}
    assert result["unaccounted_s"] == pytest.approx(1.0)  # the second between the last cell and the table
    first, second = result["cells"]
    assert first["start_s"] == 10.0 and first["wall_s"] == 22.0
    assert first["parts"] == {"train_imports_s": 3.0, "build_s": 2.5, "wandb_init_s": 1.5, "capture_s": 0.5,
                              "steps_s": 6.5, "probes_s": 1.0, "evals_s": 0.5, "maps_s": 1.5, "checkpoints_s": 0.0,
                              "end_s": 2.0, "maps_wait_s": 0.5, "wandb_finish_s": 1.0,
                              "other_s": 22.0 - 3.0 - 4.0 - 10.0 - 2.0 - 0.5 - 1.0}
    assert first["off_path"] == {"maps_draw_s": 2.0}  # its own arrays only
    assert second["parts"]["wandb_init_s"] == 0 and second["parts"]["build_s"] == 4.0  # other spans are cell 0's
    assert second["off_path"] == {"maps_draw_s": 0.25}
    assert result["cell_totals"]["steps_s"] == 6.5 + 7.0


def test_the_report_is_cut_into_its_parts():
    events = [_e("main", 100.25), _e("imports", 100.25, 103.0), _e("load_runs", 103.0, 104.0),
              _e("figures", 104.5, 110.0), _e("evidence", 104.5, 108.0), _e("statements", 110.0, 111.0)]
    result = bench.report_timeline(100.0, 112.0, 1, events)
    assert result["parts"] == {"process_start_s": 0.25, "imports_s": 2.75, "load_runs_s": 1.0, "evidence_s": 3.5,
                               "figures_wait_s": 2.0, "statements_s": 1.0, "write_and_exit_s": 1.0}
    assert result["unaccounted_s"] == pytest.approx(0.5)


def test_a_command_that_recorded_nothing_is_named():
    with pytest.raises(RuntimeError, match="no timeline"):
        bench.training_timeline(0.0, 1.0, 1, [])


def test_bad_entries_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(["--only", "default_run,nonsense"])
    assert stop.value.code == 2
    assert "--only must name entries among literal, claims_grid, default_run, report" in capsys.readouterr().err


def test_the_script_times_a_tiny_default_run(tmp_path):
    """The whole path on this machine: the command runs, every span comes back, the parts cover the wall time."""
    out = tmp_path / "timeline.json"
    result = bench.main(["--machine", "test", "--only", "default_run", "--workdir", str(tmp_path / "work"),
                         "--out", str(out), "--extra", "train.max_steps=3", "train.eval_every=0",
                         "probe.maps_every=2", "logger.mode=disabled"])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    entry = result["entries"]["default_run"]
    assert entry["command"] == "andrea-exp train.max_steps=3 train.eval_every=0 probe.maps_every=2 logger.mode=disabled"
    run = entry["runs"][0]
    assert run["argv"][0] == "andrea-exp" and run["argv"][-1].startswith("hydra.run.dir=")
    assert abs(run["unaccounted_s"]) < 0.5  # one job: nothing between its end and the exit is left out
    (cell,) = run["cells"]
    assert cell["cell"] is None and cell["parts"]["train_imports_s"] > 0 and cell["parts"]["steps_s"] > 0
    assert cell["parts"]["maps_s"] > 0 and cell["parts"]["wandb_init_s"] < 0.05  # W&B disabled: nothing started
    pngs = sorted(p.name for p in (tmp_path / "work" / "this" / "default_run_0" / "attention_maps").glob("*.png"))
    assert pngs == ["step0000000_L0.png", "step0000000_L1.png", "step0000002_L0.png", "step0000002_L1.png",
                    "step0000003_L0.png", "step0000003_L1.png"]


def test_a_command_runs_the_trees_code_first_and_keeps_what_pythonpath_held(tmp_path, monkeypatch):
    """Packages installed beside the interpreter with --target (the GPU machine's) stay importable."""
    monkeypatch.setenv("PYTHONPATH", "/opt/site-packages-elsewhere")
    argv = [sys.executable, "-c", "import os; print(os.environ['PYTHONPATH'])"]
    *_, output = bench.run_command(argv, tmp_path / "events.jsonl", tmp_path, tree=tmp_path / "tree")
    assert output.strip() == os.pathsep.join([str(tmp_path / "tree"), "/opt/site-packages-elsewhere"])
