"""Workers of `hydra/launcher=local_gpus` that start with the training code already imported.

Each worker of Hydra's joblib launcher is a fresh Python process that imports torch, torch._dynamo (which
torch.optim pulls in), matplotlib and this package before its first cell can build a model: seconds per
worker, paid by every worker at once at the start of a sweep, when they compete for the CPU. Here the
workers are forked from one multiprocessing forkserver that has imported all of that once, in the
background while Hydra prepares the jobs. What a cell computes does not change; the launcher is still
Hydra's joblib launcher, whose loky executor is told to start its workers from the forkserver (loky's
set_start_method).

The forkserver inherits the environment of the moment it starts, so it starts after the MPS callback has
set the daemon's variables (callbacks run in their order in conf/config.yaml), and with the thread limits
joblib gives the workers it starts itself (OMP_NUM_THREADS and the like: CPU cores / workers), which loky
cannot pass to a forked worker; without them every worker's torch would use every core. It ends with the
last of its workers. Nothing in PRELOAD may touch CUDA when imported (a forked child cannot use a CUDA
driver its parent initialised); each worker still chooses its GPU before CUDA starts (andrea_exp.devices).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import sys

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

# what a cell imports before its first step: the job's entry point (each worker imports the command's
# main module), torch and the loop, torch.optim's lazy torch._dynamo, the probe's matplotlib; and wandb for
# a sweep that logs. A module that fails to import is skipped by the forkserver.
PRELOAD = ("andrea_exp.cli", "torch", "torch._dynamo", "andrea_exp.train", "andrea_exp.probe", "andrea_exp.maps")
LOGGING_PRELOAD = ("wandb",)


def preload_for(config) -> list[str]:
    logging = str(OmegaConf.select(config, "logger.mode", default="disabled")) != "disabled"
    return [*PRELOAD, *(LOGGING_PRELOAD if logging else ())]


def worker_thread_limits(n_jobs) -> dict[str, str]:
    """The thread-pool variables joblib sets for the loky workers it starts itself, for n_jobs workers."""
    from joblib._parallel_backends import LokyBackend

    return LokyBackend()._prepare_worker_env(n_jobs=max(int(n_jobs or 1), 1))


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """os.environ with `variables` set, restored on exit."""
    saved = {key: os.environ.get(key) for key in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class PreloadedWorkers(Callback):
    """hydra.callbacks.preloaded_workers: local_gpus workers forked from a forkserver that imported PRELOAD."""

    def __init__(self):
        self.started = False

    def on_multirun_start(self, config, **kwargs) -> None:
        target = str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")
        if "joblib" not in target or sys.platform == "win32":
            return
        from joblib.externals.loky.backend import context

        if context.get_start_method() is not None:  # someone chose loky's start method already: keep it
            return
        context.set_start_method("forkserver")
        multiprocessing.set_forkserver_preload(preload_for(config))
        with environment(worker_thread_limits(OmegaConf.select(config, "hydra.launcher.n_jobs", default=1))):
            multiprocessing.forkserver.ensure_running()  # returns at once; the server imports PRELOAD meanwhile
        self.started = True

    def on_multirun_end(self, config, **kwargs) -> None:
        if not self.started:
            return
        self.started = False
        from joblib.externals.loky.backend import context

        context.set_start_method(None, force=True)
