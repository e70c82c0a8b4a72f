"""What a newcomer types first: a sweep preset without -m, andrea-report without --out or with one it cannot
write, Ctrl-C while the command starts. Each ends in one line that says what happened and what to do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from andrea_exp.config.schema import CONF_DIR
from andrea_exp.config.validation import command_line_error
from andrea_exp.report import __main__ as report_cli
from andrea_exp.report import markdown as report_markdown  # main() imports write_report from it when it runs

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
ENV.pop("HYDRA_FULL_ERROR", None)


# ---------------------------------------------------------------- a sweep preset without -m


def test_a_sweep_preset_without_m_is_one_line_saying_how_to_run_it(tmp_path):
    done = subprocess.run([sys.executable, "-m", "andrea_exp", "experiment=claims_grid", "train.max_steps=5"],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: experiment=claims_grid is a sweep of 36 runs over model.d_k, model.scale, model.causal, seed; run it "
        "with -m: andrea-exp -m experiment=claims_grid train.max_steps=5 (or give each of those settings one value "
        "to train a single run)"]
    assert list(tmp_path.iterdir()) == []  # no run directory


def test_a_preset_whose_every_swept_setting_is_given_runs_as_one_run():
    assert command_line_error(["experiment=leak_gap", "model.causal=false", "seed=1"], CONF_DIR) is None
    assert "sweep of 3 runs over seed" in command_line_error(["experiment=leak_gap", "model.causal=false"], CONF_DIR)
    assert command_line_error(["-m", "experiment=leak_gap"], CONF_DIR) is None


# ---------------------------------------------------------------- andrea-report


@pytest.fixture
def written(monkeypatch) -> list[Path]:
    """andrea-report's command line with the report itself replaced: the directories it was asked to write."""
    outs: list[Path] = []

    def write_report(roots, out, argv, machine, notes):
        outs.append(Path(out))
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "report.md").write_text("# report\n")
        return Path(out) / "report.md"

    monkeypatch.setattr(report_markdown, "write_report", write_report)
    return outs


def test_andrea_report_without_out_writes_beside_the_sweep_and_says_where(tmp_path, written, capsys):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    report_cli.main([str(sweep)])
    assert written == [sweep / "report"]
    out = capsys.readouterr().out
    assert f"no --out given: writing to {sweep / 'report'}" in out and f"wrote {sweep / 'report' / 'report.md'}" in out


def test_andrea_report_of_several_directories_without_out_writes_to_report_here(tmp_path, written, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    report_cli.main(["a", "b"])
    assert written == [Path("report")]


def test_andrea_report_with_an_out_it_cannot_write_is_one_line_before_any_work(tmp_path, written):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    (tmp_path / "sweep").mkdir()
    with pytest.raises(SystemExit) as ended:
        report_cli.main([str(tmp_path / "sweep"), "--out", str(blocker / "report")])
    assert ended.value.code == f"andrea-report: cannot write {blocker / 'report'} (--out): Not a directory"
    assert written == []  # refused before the runs are read


def test_andrea_report_that_fails_to_write_is_one_line(tmp_path, monkeypatch):
    def full_disk(roots, out, argv, machine, notes):
        raise OSError(28, "No space left on device", str(Path(out) / "figures" / "c1.png"))

    monkeypatch.setattr(report_markdown, "write_report", full_disk)
    (tmp_path / "sweep").mkdir()
    with pytest.raises(SystemExit) as ended:
        report_cli.main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")])
    assert ended.value.code == (f"andrea-report: cannot write {tmp_path / 'out' / 'figures' / 'c1.png'}: "
                                "No space left on device")


# ---------------------------------------------------------------- Ctrl-C while the command starts


def default_sigint() -> None:
    """In the child before it runs: SIGINT at its default, as a terminal starts a command. A suite started as a
    background job of a non-interactive shell (`pytest ... &`) runs with SIGINT ignored, and a child inherits
    that: Python then installs no handler and the command, rightly, never sees the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Once, on a loaded 2-core machine, a SIGINT 0.8 s in was lost (the run trained to its end, exit 0); an ignored
# SIGINT inherited from the suite's own start does exactly that, which default_sigint now rules out. A rerun keeps
# a rarer loss from hiding the rest of the suite; a signal that is lost three times running still fails.
@pytest.mark.flaky(reruns=2)
@pytest.mark.parametrize("after_s", [0.3, 0.8, 2.0])  # while torch and Hydra load; settings checked; later
def test_ctrl_c_during_start_up_is_one_line(tmp_path, after_s):
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", "logger.mode=disabled", f"hydra.run.dir={tmp_path}/r"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    try:
        proc.wait(timeout=after_s)  # seconds before the first step
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines() == [
        "[andrea-exp] interrupted by SIGINT during start-up, before the first training step; nothing was trained"]


def test_the_andrea_exp_command_starts_inside_the_ctrl_c_guard():
    """The console script enters where `python -m andrea_exp` does (andrea_exp.__main__), which imports the rest
    inside its guard: an interrupt while torch loads is the same one line."""
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert 'andrea-exp = "andrea_exp.__main__:main"' in pyproject.splitlines()
