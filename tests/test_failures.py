"""Failures that no setting explains (a directory that cannot be written, a full disk, a file that disappears)
end a real run with one line naming the path and the cause, exit code 1, nothing already written lost; the full
traceback only with HYDRA_FULL_ERROR=1. An interrupted run is marked and tagged `interrupted` in W&B."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tiny
from test_tracking import offline_runs, read_run

from andrea_exp.launch.cli import describe_os_error, output_dir_error

SMALL = tiny("train.max_steps=40", "train.warmup_steps=2", "train.eval_every=0", "train.log_every=1",
             "train.device=cpu", "train.sample_tokens=2")
ROOM = 12  # lines metrics.jsonl takes before the simulated disk is full

# The app with a disk that fills up after ROOM lines of metrics.jsonl: the write raises ENOSPC as a real
# write() on a full disk does, with no file name (the writer must add it).
FILLING_DISK = f"""
import errno, os
from andrea_exp.runs import rundir

class FillingUp:
    def __init__(self, fh):
        self.fh, self.room = fh, {ROOM}
    def write(self, text):
        if self.room == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= 1
        return self.fh.write(text)
    def close(self):
        self.fh.close()

real_init = rundir.MetricsFile.__init__
def init(self, *args, **kwargs):
    real_init(self, *args, **kwargs)
    self._fh = FillingUp(self._fh)
rundir.MetricsFile.__init__ = init

from andrea_exp.launch.cli import main
main()
"""

# The app with a data file that is deleted after the settings were checked and before it is read.
VANISHING_DATA = """
from pathlib import Path
from andrea_exp.data import sources as data

real_splits = data.text_splits
def vanish_then_read(path, *args, **kwargs):
    Path(path).unlink()
    return real_splits(path, *args, **kwargs)
data.text_splits = vanish_then_read

from andrea_exp.launch.cli import main
main()
"""


def env(full_error: bool = False) -> dict:
    out = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "WANDB_SILENT": "true"}
    out.pop("HYDRA_FULL_ERROR", None)
    return out | ({"HYDRA_FULL_ERROR": "1"} if full_error else {})


def run(*args: str, script: Path | None = None, full_error: bool = False, cwd: Path | None = None):
    target = [str(script)] if script else ["-m", "andrea_exp"]
    return subprocess.run([sys.executable, *target, *args], env=env(full_error), cwd=cwd, capture_output=True,
                          text=True, timeout=180)


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def write_script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "app.py"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- a run directory that cannot be written


def test_a_run_dir_below_a_file_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run(*SMALL, f"hydra.run.dir={blocker}/run")
    assert done.returncode == 1
    assert one_line(done) == f"error: cannot write {blocker}/run (hydra.run.dir): Not a directory"


def test_a_run_dir_in_a_read_only_directory_is_one_line(tmp_path):
    if os.geteuid() == 0:  # root writes into a directory whatever its mode; sysfs refuses new files even to root
        locked = Path("/sys")
        if not locked.is_dir() or os.path.exists("/sys/andrea-exp-run"):
            pytest.skip("running as root and no /sys to stand for a read-only directory")
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o555)
    try:
        done = run(*SMALL, f"hydra.run.dir={locked}/andrea-exp-run")
    finally:
        if locked != Path("/sys"):
            locked.chmod(0o755)
    assert done.returncode == 1
    assert one_line(done) == f"error: cannot write {locked}/andrea-exp-run (hydra.run.dir): Permission denied"


def test_the_default_run_dir_is_checked_in_the_working_directory(tmp_path):
    (tmp_path / "outputs").write_text("")  # the default outputs/NAME/TIME cannot be made
    done = run(*SMALL, cwd=tmp_path)
    assert done.returncode == 1
    line = one_line(done)
    assert line.startswith(f"error: cannot write {tmp_path}/outputs (hydra.run.dir)") and "Not a directory" in line


def test_a_writable_or_help_command_line_passes_the_check(tmp_path):
    assert output_dir_error([f"hydra.run.dir={tmp_path}/new/run"]) is None
    assert output_dir_error(["-m", f"hydra.sweep.dir={tmp_path}/sweep/${{now:%H}}"]) is None
    assert not (tmp_path / "new").exists()  # checked, not created
    blocker = tmp_path / "f"
    blocker.write_text("")
    assert output_dir_error(["--help", f"hydra.run.dir={blocker}/run"]) is None
    assert "hydra.sweep.dir" in output_dir_error(["-m", f"hydra.sweep.dir={blocker}/s"])


def test_hydra_full_error_keeps_the_traceback(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run(*SMALL, f"hydra.run.dir={blocker}/run", full_error=True)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "NotADirectoryError" in done.stderr


# ---------------------------------------------------------------- a full disk


def test_a_full_disk_is_one_line_naming_metrics_jsonl(tmp_path):
    """/dev/full refuses every write with ENOSPC: a full disk without any patching."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").symlink_to("/dev/full")
    done = run(*SMALL, f"hydra.run.dir={run_dir}")
    assert done.returncode == 1
    assert one_line(done) == f"error: cannot write {run_dir}/metrics.jsonl: No space left on device"
    assert summary(run_dir)["run/status"] == "failed"


def test_a_disk_full_mid_run_keeps_every_record_and_writes_a_failed_summary(tmp_path):
    run_dir = tmp_path / "run"
    done = run(*SMALL, f"hydra.run.dir={run_dir}", script=write_script(tmp_path, FILLING_DISK))
    assert done.returncode == 1
    assert one_line(done) == f"error: cannot write {run_dir}/metrics.jsonl: No space left on device"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(ROOM))  # what was written before the disk filled is kept
    failed = summary(run_dir)
    assert failed["run/status"] == "failed" and failed["run/steps"] >= ROOM
    assert failed["run/error"] == f"OSError: [Errno {errno.ENOSPC}] No space left on device: '{run_dir}/metrics.jsonl'"
    assert isinstance(failed["train/loss"], float)  # the last values measured are in the summary


def test_a_disk_full_mid_run_with_full_error_shows_the_traceback(tmp_path):
    run_dir = tmp_path / "run"
    done = run(*SMALL, f"hydra.run.dir={run_dir}", script=write_script(tmp_path, FILLING_DISK), full_error=True)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "No space left on device" in done.stderr
    assert summary(run_dir)["run/status"] == "failed"


# The disk of FILLING_DISK, full for summary.json too: its temporary file's write fails with no file name, as
# pathlib's write_text does on a real full disk.
FILLING_DISK_AND_SUMMARY = FILLING_DISK.replace("from andrea_exp.launch.cli import main", """
import pathlib
real_write_text = pathlib.Path.write_text
def write_text(self, *args, **kwargs):
    if self.name == "summary.json.tmp":
        real_write_text(self, "{")  # a part of it, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_write_text(self, *args, **kwargs)
pathlib.Path.write_text = write_text

from andrea_exp.launch.cli import main""")


def test_a_full_disk_that_also_refuses_the_summary_names_metrics_jsonl(tmp_path):
    run_dir = tmp_path / "run"
    done = run(*SMALL, f"hydra.run.dir={run_dir}", script=write_script(tmp_path, FILLING_DISK_AND_SUMMARY))
    assert done.returncode == 1
    assert one_line(done) == f"error: cannot write {run_dir}/metrics.jsonl: No space left on device"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(ROOM))
    assert not (run_dir / "summary.json.tmp").exists()  # no part of a summary left behind


def test_a_full_disk_at_a_checkpoint_is_one_line_naming_it(tmp_path):
    """torch.save reports a failed write as RuntimeError('[enforce fail at inline_container.cc:...]'); the run
    ends with the checkpoint's path and the cause instead, and keeps every record it wrote."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest.pt.tmp").symlink_to("/dev/full")  # the checkpoint's write goes to a full disk
    done = run(*SMALL, f"hydra.run.dir={run_dir}")
    assert done.returncode == 1
    assert one_line(done) == f"error: cannot write {run_dir}/checkpoints/latest.pt: No space left on device"
    assert summary(run_dir)["run/status"] == "failed"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train/loss" in r] == list(range(40))
    assert list((run_dir / "checkpoints").iterdir()) == []


def test_a_failed_checkpoint_write_keeps_the_previous_checkpoint(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    import torch

    from andrea_exp.training import checkpoint

    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    save = lambda step: checkpoint.save(tmp_path, step=step, model=model, optimizer=optimizer, scheduler=scheduler,
                                        extra={})
    save(3)
    before = (tmp_path / checkpoint.LATEST).read_bytes()
    (tmp_path / (checkpoint.LATEST + ".tmp")).symlink_to("/dev/full")
    with pytest.raises(OSError) as failed:
        save(4)
    assert (failed.value.errno, failed.value.filename) == (errno.ENOSPC, str(tmp_path / checkpoint.LATEST))
    assert (tmp_path / checkpoint.LATEST).read_bytes() == before
    assert checkpoint.load(tmp_path)["step"] == 3


# ---------------------------------------------------------------- a file that disappears


def test_a_data_file_that_disappears_is_one_line(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    run_dir = tmp_path / "run"
    done = run(*SMALL, "data=text", f"data.path={text}", f"hydra.run.dir={run_dir}",
               script=write_script(tmp_path, VANISHING_DATA))
    assert done.returncode == 1
    assert one_line(done) == f"error: cannot read {text}: No such file or directory"
    assert summary(run_dir)["run/status"] == "failed"


def test_os_errors_are_described_by_path_and_cause():
    full = OSError(errno.ENOSPC, "No space left on device", "/x/metrics.jsonl")
    assert describe_os_error(full) == "cannot write /x/metrics.jsonl: No space left on device"
    assert describe_os_error(PermissionError(errno.EACCES, "Permission denied", "/x")) == \
        "cannot access /x: Permission denied"
    assert describe_os_error(OSError(errno.EIO, "Input/output error")) == "OSError: Input/output error"
    try:  # the disk that filled also refuses the summary: the first error is the cause
        try:
            raise full
        except OSError:
            raise OSError(errno.ENOSPC, "No space left on device", "/x/summary.json") from None
    except OSError as later:
        assert later.__context__ is full
        assert describe_os_error(later) == "cannot write /x/metrics.jsonl: No space left on device"


# ---------------------------------------------------------------- an interrupted run in W&B


def test_an_interrupted_run_is_tagged_and_marked_interrupted_in_wandb(tmp_path):
    run_dir = tmp_path / "run"
    args = [*[a for a in SMALL if not a.startswith(("logger.mode", "train.max_steps"))], "logger.mode=offline",
            "train.max_steps=100000", f"hydra.run.dir={run_dir}"]
    wandb_env = env() | {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
                         "NETRC": str(tmp_path / "no-netrc")}
    wandb_env.pop("WANDB_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "andrea_exp", *args], env=wandb_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no training step logged in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert summary(run_dir)["run/status"] == "interrupted"
    (wandb_dir,) = offline_runs(run_dir)
    seen = read_run(wandb_dir)
    assert seen["summary"]["run/status"] == "interrupted"
    assert "interrupted" in seen["run"]["tags"] and "diverged" not in seen["run"]["tags"]
    assert seen["exit_code"] == 0  # a pause, not a failure: W&B shows it finished, the tag tells it apart
