"""A damaged run directory (a summary.json that is no JSON object, a metrics.jsonl cut short) is reported in one
line naming the file, and every reader of run directories goes on with the other runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from andrea_exp.report.runs import load_runs
from andrea_exp.runs import frame, reader, rundir, table

FINISHED = {"run/status": "finished", "run/steps": 4, "eval/loss_as_trained": 1.5}


def job(sweep: Path, name: str, summary: dict | str | None, steps: list[int] | str = ()) -> Path:
    """A job directory as Hydra and the loop leave it: .hydra/, summary.json (text as given), metrics.jsonl."""
    run = sweep / name
    (run / ".hydra").mkdir(parents=True)
    if summary is not None:
        (run / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    lines = steps if isinstance(steps, str) else "".join(json.dumps({"step": s, "train/loss": 2.0}) + "\n"
                                                         for s in steps)
    (run / "metrics.jsonl").write_text(lines)
    return run


@pytest.fixture
def sweep(tmp_path) -> Path:
    root = tmp_path / "sweep"
    job(root, "0", FINISHED, [0, 2, 4])
    job(root, "1", json.dumps(FINISHED)[:30], [0, 2, 4])  # a summary cut short
    job(root, "2", FINISHED, [0, 2])  # a finished run whose log stops at step 2 of 4
    return root


def test_the_report_reads_the_sound_runs_and_names_each_damaged_file(sweep, capsys):
    damaged = []
    runs = load_runs([sweep], damaged)
    assert [run.path.name for run in runs] == ["0"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and len(damaged) == 2
    assert err[0].startswith(f"[andrea-exp] skipped a damaged run: {sweep / '1' / 'summary.json'} is not valid JSON (")
    assert err[1] == (f"[andrea-exp] skipped a damaged run: {sweep / '2' / 'metrics.jsonl'} ends at step 2, but "
                      "summary.json records a run finished after 4 steps: the file was cut")


def test_the_sweep_table_shows_a_damaged_summary_as_a_row(sweep, capsys):
    assert frame.main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "3 cells, 1 failed" in out
    assert any(line.split()[:3] == ["1", "(defaults)", "damaged"] for line in out.splitlines())
    assert f"  cell 1 damaged: {sweep / '1' / 'summary.json'} is not valid JSON (" in out
    assert table.failed_of(table.read_cells(sweep)) == ["1"]


@pytest.mark.parametrize("text, why", [("[1, 2]", "holds a JSON list, not the run's summary object"),
                                       ('{"run/status": "fini', "is not valid JSON (")])
def test_read_summary_raises_one_line_naming_the_file(tmp_path, text, why):
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(rundir.DamagedRun) as err:
        rundir.read_summary(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'summary.json'} {why}") and "\n" not in str(err.value)


def test_a_cut_line_is_damage_only_where_the_run_wrote_its_summary(tmp_path):
    cut = json.dumps({"step": 0, "train/loss": 2.0}) + "\n" + '{"step": 2, "train/lo'
    killed = job(tmp_path, "killed", None, cut)  # killed while logging: no summary, the last line cut by the kill
    assert [r["step"] for r in reader.read_run(killed).records] == [0]
    finished = job(tmp_path, "finished", FINISHED, cut + "\n" + json.dumps({"step": 4}) + "\n")
    with pytest.raises(rundir.DamagedRun, match=r"metrics\.jsonl has 1 unreadable line\(s\) \(line 2\) although the "
                                                r"run finished: the file was cut"):
        reader.read_run(finished)
    assert reader.read_run(finished, records=False).summary == FINISHED  # the summary alone is sound


def test_a_whole_log_is_no_damage(tmp_path):
    for status, steps in (("finished", [0, 2, 4]), ("diverged", [0, 1]), ("interrupted", [0, 2]), ("failed", [])):
        run = job(tmp_path, status, {**FINISHED, "run/status": status}, steps)
        assert reader.read_run(run).status == status
