"""mps: when a sweep starts its own MPS daemon, how the workers find it, and that it is stopped."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import compose_config

from andrea_exp.config.validation import ConfigError
from andrea_exp.launch import mps

JOBLIB = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
GOOD = dict(launcher_target=JOBLIB, cells_per_gpu=4, gpus=["0"], control="/usr/bin/nvidia-cuda-mps-control", env={})


def test_nothing_stands_against_a_local_sweep_sharing_a_gpu():
    if (mps.DEFAULT_PIPE_DIR / "control").exists():
        pytest.skip("a system MPS daemon is running here")
    assert mps.reasons_against(**GOOD) == []


@pytest.mark.parametrize("changed, why", [
    ({"launcher_target": "hydra._internal.core_plugins.basic_launcher.BasicLauncher"}, "not local_gpus"),
    ({"cells_per_gpu": 1}, "cells_per_gpu is 1"),
    ({"gpus": []}, "no GPU is visible"),
    ({"control": None}, "not on PATH"),
    ({"env": {"CUDA_MPS_PIPE_DIRECTORY": "/somewhere"}}, "already set up"),
])
def test_each_reason_against_is_named(changed, why):
    against = mps.reasons_against(**{**GOOD, **changed})
    assert len(against) == 1 and why in against[0]


@pytest.mark.parametrize("bad", ["maybe", 1, 0, None])
def test_bad_value_is_refused_in_one_line(bad):
    with pytest.raises(ConfigError, match=r"^mps must be one of auto, true, false; got"):
        mps.check_setting(bad)


def test_mps_true_where_it_cannot_run_stops_the_sweep_before_any_cell(tmp_path: Path):
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k != "CUDA_MPS_PIPE_DIRECTORY"}
    done = subprocess.run([sys.executable, "-m", "andrea_exp", "-m", "mps=true", "train.max_steps=2",
                           f"hydra.sweep.dir={sweep}", "logger.mode=disabled", "train.progress=false"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "mps=true needs hydra/launcher=local_gpus" in errors[0]
    assert "cells_per_gpu is 1" in errors[0]
    assert not sweep.exists()  # no cell started


FAKE_CONTROL = """#!/bin/sh
# stands in for nvidia-cuda-mps-control: records how it was called and keeps the control socket's place
echo "$@|$CUDA_MPS_PIPE_DIRECTORY|$CUDA_MPS_LOG_DIRECTORY" >> "{calls}"
if [ "$1" = "-d" ]; then touch "$CUDA_MPS_PIPE_DIRECTORY/control"; exit 0; fi
read line; echo "stdin:$line" >> "{calls}"
[ "$line" = "quit" ] && rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"
"""


def fake_control(tmp_path: Path) -> tuple[Path, Path]:
    """FAKE_CONTROL installed as tmp_path/bin/nvidia-cuda-mps-control, and the file it records its calls in."""
    if (mps.DEFAULT_PIPE_DIR / "control").exists():
        pytest.skip("a system MPS daemon is running here")
    calls = tmp_path / "calls.txt"
    control = tmp_path / "bin" / mps.CONTROL
    control.parent.mkdir()
    control.write_text(FAKE_CONTROL.format(calls=calls))
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    return control, calls


def test_a_sweep_starts_its_own_daemon_exports_it_and_stops_it(tmp_path: Path, monkeypatch):
    control, calls = fake_control(tmp_path)
    monkeypatch.setenv("PATH", f"{control.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    config = compose_config("hydra/launcher=local_gpus", "cells_per_gpu=3", "mps=auto", hydra=True)

    callback = mps.MpsCallback()
    callback.on_multirun_start(config)
    pipe = Path(os.environ["CUDA_MPS_PIPE_DIRECTORY"])  # what the workers started next inherit
    daemon_dir = callback.daemon.dir
    assert pipe == daemon_dir / "pipe" and (pipe / "control").exists()
    assert Path(os.environ["CUDA_MPS_LOG_DIRECTORY"]) == daemon_dir / "log"
    first = calls.read_text().splitlines()[0]
    assert first == f"-d|{pipe}|{daemon_dir / 'log'}"

    started = time.monotonic()
    callback.on_multirun_end(config)
    assert time.monotonic() - started < 1.0  # the command does not wait for the daemon
    deadline = time.monotonic() + 20
    while daemon_dir.exists() and time.monotonic() < deadline:  # the background quit, then its clean-up
        time.sleep(0.05)
    lines = calls.read_text().splitlines()
    assert lines[1] == f"|{pipe}|{daemon_dir / 'log'}" and lines[2] == "stdin:quit"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and not daemon_dir.exists()
    callback.on_multirun_end(config)  # a second end (the exit hook) does nothing
    assert len(calls.read_text().splitlines()) == 3


def test_a_daemon_shared_by_several_sweeps_is_started_handed_on_and_stopped_from_the_shell(tmp_path: Path):
    """`python -m andrea_exp.launch.mps start` (reproduce.sh's lanes): the same daemon and reasons as a sweep's own,
    handed on as one `export` line; `stop` asks it to quit in the background and removes its directory."""
    control, calls = fake_control(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env.update(PATH=f"{control.parent}{os.pathsep}{env['PATH']}", CUDA_VISIBLE_DEVICES="0")

    def cli(*args, **extra):
        return subprocess.run([sys.executable, "-m", "andrea_exp.launch.mps", *args], capture_output=True, text=True,
                              timeout=60, env={**env, **extra})

    started = cli("start", "--cells-per-gpu", "12")
    assert started.returncode == 0, started.stderr
    words = shlex.split(started.stdout)
    assert words[0] == "export" and len(words) == 3 and started.stdout.count("\n") == 1
    handed = dict(word.split("=", 1) for word in words[1:])
    pipe, log = Path(handed["CUDA_MPS_PIPE_DIRECTORY"]), Path(handed["CUDA_MPS_LOG_DIRECTORY"])
    daemon_dir = pipe.parent
    assert daemon_dir.name.startswith(mps.DIR_PREFIX) and log == daemon_dir / "log" and (pipe / "control").exists()
    assert calls.read_text().splitlines() == [f"-d|{pipe}|{log}"]
    assert cli("stop", **handed).returncode == 0
    deadline = time.monotonic() + 20
    while daemon_dir.exists() and time.monotonic() < deadline:  # the background quit, then its clean-up
        time.sleep(0.05)
    assert not daemon_dir.exists() and calls.read_text().splitlines()[1:] == [f"|{pipe}|{log}", "stdin:quit"]
    nothing = cli("start", "--cells-per-gpu", "12", CUDA_VISIBLE_DEVICES="")  # a sweep would not start one
    assert nothing.returncode == 0 and nothing.stdout == "" and "no GPU is visible" in nothing.stderr
    system = cli("stop", CUDA_MPS_PIPE_DIRECTORY=str(mps.DEFAULT_PIPE_DIR))  # not ours: left alone
    assert system.returncode == 0 and len(calls.read_text().splitlines()) == 3


def test_mps_false_starts_nothing(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    config = compose_config("hydra/launcher=local_gpus", "cells_per_gpu=3", "mps=false", hydra=True)
    callback = mps.MpsCallback()
    callback.on_multirun_start(config)
    assert callback.daemon is None


def test_a_daemon_that_waits_for_clients_is_asked_again_in_the_background(tmp_path: Path, monkeypatch):
    control = tmp_path / mps.CONTROL
    marker = tmp_path / "quit_done"
    control.write_text('#!/bin/sh\nif [ "$1" = "-d" ]; then exit 0; fi\nread line; sleep 2; '
                       f'touch "{marker}"\n')
    control.chmod(control.stat().st_mode | stat.S_IEXEC)
    lines = []
    daemon = mps.MpsDaemon(str(control), log=lines.append)
    started = time.monotonic()
    daemon.stop(wait_s=0.3)
    assert time.monotonic() - started < 1.5  # the command does not wait for the clients
    assert len(lines) == 1 and "quits once its last client exits" in lines[0]
    deadline = time.monotonic() + 20
    while not (marker.exists() and not daemon.dir.exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists() and not daemon.dir.exists()  # asked again, then its directory removed


def test_idle_launcher_workers_are_ended():
    joblib = pytest.importorskip("joblib")
    from joblib.externals.loky import reusable_executor

    joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(os.getpid)() for _ in range(2))
    executor = reusable_executor._executor
    workers = list(executor._processes.values())
    assert workers and all(w.is_alive() for w in workers)
    mps.stop_idle_workers()
    assert not any(w.is_alive() for w in workers)
