"""local_gpus workers forked from a forkserver that has already imported the training code."""

from __future__ import annotations

import os
import sys

import joblib
import pytest
from hydra import compose, initialize_config_dir
from joblib.externals.loky import get_reusable_executor
from joblib.externals.loky.backend import context

from andrea_exp import devices
from andrea_exp.schema import CONF_DIR
from andrea_exp.workers import PRELOAD, PreloadedWorkers, preload_for, worker_thread_limits

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no forkserver on Windows")


def _config(*overrides):
    devices.register_resolver()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def what_a_worker_starts_with(_):
    """Run in a worker: its parent and what it had imported and inherited before its first job."""
    return {"parent": os.getppid(), "modules": [m for m in PRELOAD if m in sys.modules],
            "omp": os.environ.get("OMP_NUM_THREADS")}


def test_workers_come_from_a_forkserver_with_the_training_code_imported():
    cfg = _config("hydra/launcher=local_gpus", "cells_per_gpu=2", "logger.mode=disabled")
    callback = PreloadedWorkers()
    callback.on_multirun_start(cfg)
    try:
        assert callback.started and context.get_start_method() == "forkserver"
        seen = joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(what_a_worker_starts_with)(i) for i in range(2))
    finally:
        get_reusable_executor().shutdown(wait=True)
        callback.on_multirun_end(cfg)
    assert context.get_start_method() is None  # the next multirun chooses afresh
    n_jobs = cfg.hydra.launcher.n_jobs
    for worker in seen:
        assert worker["parent"] != os.getpid()  # forked by the forkserver, not started by this process
        assert worker["modules"] == list(PRELOAD)  # imported before the job arrived
        assert worker["omp"] == worker_thread_limits(n_jobs)["OMP_NUM_THREADS"]  # joblib's own limit


def test_other_launchers_and_a_chosen_start_method_are_left_alone():
    callback = PreloadedWorkers()
    callback.on_multirun_start(_config("logger.mode=disabled"))  # Hydra's basic launcher: one process
    assert not callback.started and context.get_start_method() is None
    context.set_start_method("spawn")
    try:
        callback.on_multirun_start(_config("hydra/launcher=local_gpus", "logger.mode=disabled"))
        assert not callback.started and context.get_start_method() == "spawn"
    finally:
        context.set_start_method(None, force=True)


def test_wandb_is_preloaded_only_for_a_sweep_that_logs():
    assert "wandb" not in preload_for(_config("logger.mode=disabled"))
    assert preload_for(_config("logger.mode=offline"))[-1] == "wandb"


def test_thread_limits_are_cores_over_workers_unless_set(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert worker_thread_limits(10**6)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_thread_limits(10**6)["OMP_NUM_THREADS"] == "3"  # the user's setting wins, as in joblib
