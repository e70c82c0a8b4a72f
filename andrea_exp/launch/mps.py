"""Cells that share a GPU run their kernels side by side: a private CUDA MPS daemon for a local sweep.

Separate processes on one GPU time-slice it: a kernel of one cell never runs beside a kernel of another,
so `cells_per_gpu` > 1 saves start-up time but not GPU time. Under NVIDIA's Multi-Process Service (MPS)
the processes' kernels share the GPU's SMs at once; small cells, which fill a fraction of the GPU each,
then overlap. The kernels and their numbers are the same either way.

`mps` (top level, like `cells_per_gpu`):
- auto: on for `hydra/launcher=local_gpus` with `cells_per_gpu` > 1 when a GPU is visible,
  `nvidia-cuda-mps-control` is on PATH and no MPS daemon is already set up (CUDA_MPS_PIPE_DIRECTORY
  unset, no daemon at the default /tmp/nvidia-mps); otherwise off, or a one-line note why it could not start;
- true: the same, but a sweep that cannot have it stops at once with a one-line error;
- false: never.

The daemon is private to the sweep: its pipe and log directories are a new temporary directory, exported
to the workers (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY) before the launcher starts them, and it
is told to quit when the sweep ends or the command exits.
"""

from __future__ import annotations

import atexit
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from andrea_exp.config.validation import ConfigError
from andrea_exp.launch import devices

CHOICES = ("auto", True, False)
CONTROL = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIR = Path("/tmp/nvidia-mps")  # where a system-wide daemon listens
DIR_PREFIX = "andrea-mps-"  # a private daemon's directory, in the temporary directory


def check_setting(setting) -> None:
    if setting not in CHOICES or (isinstance(setting, int) and not isinstance(setting, bool)):
        raise ConfigError(f"mps must be one of auto, true, false; got {setting!r}")


def reasons_against(*, launcher_target: str, cells_per_gpu: int, gpus: list[str], control: str | None,
                    env: dict) -> list[str]:
    """Why this sweep cannot or need not start its own daemon (empty: it should)."""
    checks = (("the launcher is not local_gpus", "joblib" not in launcher_target),
              (f"cells_per_gpu is {cells_per_gpu}", cells_per_gpu < 2),
              ("no GPU is visible", not gpus),
              (f"{CONTROL} is not on PATH", control is None),
              ("an MPS daemon is already set up", "CUDA_MPS_PIPE_DIRECTORY" in env
               or (DEFAULT_PIPE_DIR / "control").exists()))
    return [why for why, bad in checks if bad]


class MpsDaemon:
    """A started `nvidia-cuda-mps-control -d` with its own pipe directory; `stop()` asks it to quit."""

    def __init__(self, control: str, log=print, running_in: Path | None = None):
        """Start a daemon in a new temporary directory or, with `running_in`, stand for the one already
        started there (by another process, e.g. `python -m andrea_exp.launch.mps start`)."""
        self.control, self.log = control, log
        self.dir = running_in or Path(tempfile.mkdtemp(prefix=DIR_PREFIX))  # short: the pipe is a unix socket path
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": str(self.dir / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(self.dir / "log")}
        if running_in is None:
            for path in self.env.values():
                Path(path).mkdir()
            subprocess.run([control, "-d"], env={**os.environ, **self.env}, check=True, timeout=30,
                           capture_output=True)
        self.running = True

    def stop(self, wait_s: float = 0.0) -> None:
        """Ask the daemon to quit. It quits once its last client (a worker's CUDA context) has exited, so by
        default the request is left to a background shell, which then removes the pipe directory, and the
        sweep command returns at once; wait_s > 0 waits that long in the foreground first."""
        if not self.running:
            return
        self.running = False
        control = Path(self.env["CUDA_MPS_PIPE_DIRECTORY"]) / "control"  # the daemon removes it as it exits
        if wait_s > 0:
            try:
                subprocess.run([self.control], input="quit\n", text=True, env={**os.environ, **self.env},
                               timeout=wait_s, capture_output=True)
                deadline = time.monotonic() + wait_s
                while control.exists() and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not control.exists():
                    shutil.rmtree(self.dir, ignore_errors=True)
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            self.log(f"[andrea-exp] MPS: the daemon quits once its last client exits (pipe dir {self.dir})")
        subprocess.Popen(["sh", "-c", f'echo quit | "{self.control}"; i=0; while [ -e "{control}" ] && [ $i -lt 600 ]; '
                                      f'do sleep 0.1; i=$((i+1)); done; rm -rf "{self.dir}"'],
                         env={**os.environ, **self.env}, start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop_idle_workers(wait: bool = True) -> None:
    """End joblib's reusable worker processes (the local_gpus launcher leaves them idle for reuse): each holds
    its CUDA context, so an MPS daemon asked to quit would wait for them. wait=False: ask, don't wait."""
    executor_module = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(executor_module, "_executor", None)
    if executor is not None:
        executor.shutdown(wait=wait, kill_workers=False)


class MpsCallback(Callback):
    """hydra.callbacks.mps: start the sweep's daemon before the launcher starts workers, stop it after."""

    def __init__(self):
        self.daemon: MpsDaemon | None = None
        self.saved_env: dict[str, str | None] = {}

    def on_multirun_start(self, config, **kwargs) -> None:
        try:
            self.start(config)
        except ConfigError as err:  # Hydra turns a callback's exception into a warning: stop the sweep here
            print(f"error: {err}", file=sys.stderr, flush=True)
            sys.exit(2)

    def start(self, config) -> None:
        setting = OmegaConf.select(config, "mps", default="auto")
        check_setting(setting)
        if setting is False:
            return
        cells = OmegaConf.select(config, "cells_per_gpu", default=1)
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        control = shutil.which(CONTROL)
        against = reasons_against(launcher_target=target, cells_per_gpu=int(cells), gpus=devices.visible_gpus(),
                                  control=control, env=dict(os.environ))
        if against:
            if setting is True:
                raise ConfigError(f"mps=true needs hydra/launcher=local_gpus, cells_per_gpu >= 2, a GPU, {CONTROL} "
                                  f"and no MPS daemon already set up; here {', '.join(against)}")
            return
        try:
            self.daemon = MpsDaemon(control)
        except (OSError, subprocess.SubprocessError) as err:
            if setting is True:
                raise ConfigError(f"mps=true: {CONTROL} -d failed ({type(err).__name__})") from err
            print(f"[andrea-exp] MPS: the daemon did not start ({type(err).__name__}); cells time-slice the GPU",
                  flush=True)
            return
        self.saved_env = {key: os.environ.get(key) for key in self.daemon.env}
        os.environ.update(self.daemon.env)  # the workers the launcher starts next inherit it
        atexit.register(self.on_multirun_end, config)
        print(f"[andrea-exp] MPS: cells sharing a GPU run side by side (private daemon in {self.daemon.dir})",
              flush=True)

    def on_multirun_end(self, config, **kwargs) -> None:
        if self.daemon is None:
            return
        # the daemon quits only once its clients have: the launcher's idle workers are asked to end, and the
        # quit request waits for them in the background, so the command returns as soon as the sweep is done
        stop_idle_workers(wait=False)
        self.daemon.stop()
        self.daemon = None
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv=None) -> int:
    """`python -m andrea_exp.launch.mps start --cells-per-gpu N`: start a daemon that several local sweeps share (each
    finds it set up and starts none of its own) and print the `export` line that hands it to them, or print
    nothing where a sweep would not start one (the same reasons); `stop`: ask the daemon named by
    CUDA_MPS_PIPE_DIRECTORY, one started by `start`, to quit in the background and remove its directory."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m andrea_exp.launch.mps", description=main.__doc__)
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("--cells-per-gpu", type=int, default=2)
    args = parser.parse_args(argv)
    control = shutil.which(CONTROL)
    if args.action == "start":
        against = reasons_against(launcher_target="joblib", cells_per_gpu=args.cells_per_gpu,
                                  gpus=devices.visible_gpus(), control=control, env=dict(os.environ))
        if against:
            print(f"[andrea-exp] MPS: no shared daemon ({', '.join(against)})", file=sys.stderr)
            return 0
        try:
            daemon = MpsDaemon(control)
        except (OSError, subprocess.SubprocessError) as err:
            print(f"[andrea-exp] MPS: the shared daemon did not start ({type(err).__name__}); each sweep starts "
                  "its own", file=sys.stderr)
            return 0
        print("export " + " ".join(f"{key}={shlex.quote(value)}" for key, value in daemon.env.items()))
        print(f"[andrea-exp] MPS: one daemon for the sweeps that follow (in {daemon.dir})", file=sys.stderr)
        return 0
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if control is None or pipe is None or not Path(pipe).parent.name.startswith(DIR_PREFIX):
        return 0  # nothing of ours to stop (a system daemon is left alone)
    MpsDaemon(control, running_in=Path(pipe).parent).stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
