"""Every command exits non-zero on an error with one line that names the problem: the `python -m` spellings of
prepare and corpora, a destination that cannot be written, a file given where run directories are wanted,
and values swept without -m."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from andrea_exp.config.schema import CONF_DIR
from andrea_exp.config.validation import command_line_error
from andrea_exp.data import corpora
from andrea_exp.runs import frame


def python_m(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


@pytest.mark.parametrize("module, args", [("andrea_exp.prepare", ("missing.txt", "--out", "x")),
                                          ("andrea_exp.corpora", ("nope", "corpora")),
                                          ("andrea_exp.runs", ("no-such-sweep",))])
def test_python_m_commands_exit_non_zero_on_an_error(tmp_path, module, args):
    done = python_m(module, *args, cwd=tmp_path)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert not (tmp_path / "x").exists() and not (tmp_path / "corpora").exists()


def test_a_corpus_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("in the way\n")
    assert corpora.main(["shakespeare", str(tmp_path / "afile" / "corpora")]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {tmp_path / 'afile' / 'corpora'} cannot be written: no file can be created in "
                   f"{tmp_path / 'afile'} (Not a directory)\n")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_an_unwritable_out_names_the_directory_not_a_temporary_file(tmp_path):
    (tmp_path / "tiny.txt").write_text("some text " * 100)
    done = python_m("andrea_exp.prepare", "tiny.txt", "--out", "/proc/nope", "--seq-len", "8", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == ("error: --out '/proc/nope' cannot be written: no file can be created in /proc "
                           "(No such file or directory)\n")


def job(sweep: Path, name: str, summary: dict) -> Path:
    run = sweep / name
    (run / ".hydra").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_runs_csv_that_cannot_be_written_is_one_line_before_reading(tmp_path, capsys):
    job(tmp_path / "sweep", "0", {"run/status": "finished", "run/steps": 3})
    (tmp_path / "afile").write_text("")
    assert frame.main([str(tmp_path / "sweep"), "--csv", str(tmp_path / "afile" / "runs.csv")]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # refused before the table
    assert err == (f"error: --csv {tmp_path / 'afile' / 'runs.csv'} cannot be written: no file can be created in "
                   f"{tmp_path / 'afile'} (Not a directory)\n")


def test_the_report_says_a_file_is_a_file(tmp_path, capsys):
    from andrea_exp.report.__main__ import main

    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(SystemExit) as stop:
        main([str(tmp_path / "notes.txt")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"SWEEP_DIR must be directories of runs; these are files: {tmp_path / 'notes.txt'}")


def test_values_swept_without_m_get_the_command_with_m():
    assert command_line_error(["model.d_k=16,64", "train.max_steps=3"], CONF_DIR) == (
        "values separated by commas are a sweep (model.d_k (2 values)); run it with -m: "
        "andrea-exp -m model.d_k=16,64 train.max_steps=3")
    assert command_line_error(["-m", "model.d_k=16,64"], CONF_DIR) is None


def test_a_vocabulary_of_one_token_is_refused():
    assert command_line_error(["data.vocab_size=1"], CONF_DIR) == "data.vocab_size must be an integer >= 2; got 1"
