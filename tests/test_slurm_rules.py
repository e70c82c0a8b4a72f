"""The SLURM launcher's rules that need no cluster: a request checked against sinfo's answer, sbatch's refusal
as one line, the requeued job that continues its own cell (and no other), the time-limit signal as a stop
request. The same paths against a real cluster are in test_slurm.py."""

from __future__ import annotations

import os
import signal

import pytest

from andrea_exp.launch import slurm_job
from andrea_exp.launch.slurm import _gpus, _minutes, format_states, request_refusal, sbatch_refusal
from andrea_exp.runs import run_guard
from andrea_exp.training import time_limit

# sinfo -h -o '%P|%c|%m|%G|%l' on a cluster with a default CPU partition and a GPU one
SINFO = "cpu*|2|3900|(null)|1:00:00\ngpu|64+|512000|gpu:h100:8(S:0-1)|2-00:00:00\n"
FITS = {"partition": None, "cpus_per_task": 2, "tasks_per_node": 1, "mem_gb": 3, "gpus_per_node": 0,
        "timeout_min": 60, "signal_delay_s": 120}


def test_sinfo_time_limits_and_gres_read_as_minutes_and_gpus():
    assert _minutes("infinite") == float("inf")
    assert _minutes("30") == 30 and _minutes("1:30") == 1.5 and _minutes("1:00:00") == 60
    assert _minutes("2-00:00:00") == 2 * 24 * 60
    assert (_gpus("gpu:h100:8(S:0-1)"), _gpus("gpu:2"), _gpus("(null)"), _gpus("gpu:a100:4,shard:8")) == (8, 2, 0, 4)


@pytest.mark.parametrize("change, refusal", [
    ({}, None),
    ({"cpus_per_task": 3}, "hydra.launcher.cpus_per_task=3: the nodes of partition cpu have at most 2 CPUs"),
    ({"cpus_per_task": 1, "tasks_per_node": 3}, "hydra.launcher.cpus_per_task=1: the nodes of partition cpu have "
                                                "at most 2 CPUs"),
    ({"mem_gb": 4}, "hydra.launcher.mem_gb=4: the nodes of partition cpu have at most 3.8 GB (3900 MB)"),
    ({"gpus_per_node": 1}, "hydra.launcher.gpus_per_node=1: the nodes of partition cpu have no GPUs (set 0)"),
    ({"timeout_min": 61}, "hydra.launcher.timeout_min=61: partition cpu allows at most 60 minutes"),
    ({"partition": "gpu", "gpus_per_node": 8, "cpus_per_task": 64, "mem_gb": 500, "timeout_min": 2880}, None),
    ({"partition": "gpu", "gpus_per_node": 9}, "hydra.launcher.gpus_per_node=9: the nodes of partition gpu have at "
                                               "most 8 GPUs"),
    ({"partition": "big"}, "hydra.launcher.partition=big: no such partition on this cluster (it has: cpu, gpu)"),
    ({"timeout_min": 1, "signal_delay_s": 60}, "hydra.launcher.signal_delay_s=60 is not shorter than "
     "hydra.launcher.timeout_min=1 (60 s): the time-limit signal would come before the cell starts; set it below 60"),
    ({"on_interrupt": "cancel"}, None),
    ({"on_interrupt": "stop"}, "hydra.launcher.on_interrupt must be one of keep, cancel; got 'stop'"),
])
def test_a_request_no_node_can_run_is_refused_in_one_line(change, refusal):
    assert request_refusal({**FITS, **change}, SINFO) == refusal


def test_without_sinfo_only_the_request_itself_is_checked():
    assert request_refusal({**FITS, "cpus_per_task": 999}, None) is None
    assert "signal_delay_s=90" in request_refusal({**FITS, "timeout_min": 1, "signal_delay_s": 90}, None)


@pytest.mark.parametrize("stderr, line", [
    ("sbatch: error: invalid partition specified: gpu\nsbatch: error: Batch job submission failed: Invalid partition "
     "name specified", "sbatch refused the sweep (hydra.launcher.partition=gpu): Invalid partition name specified"),
    ("sbatch: error: Invalid generic resource (gres) specification",
     "sbatch refused the sweep (hydra.launcher.gpus_per_node=1): Invalid generic resource (gres) specification"),
    ("sbatch: error: Memory specification can not be satisfied\nsbatch: error: Batch job submission failed: "
     "Requested node configuration is not available",
     "sbatch refused the sweep (hydra.launcher.mem_gb=64): Requested node configuration is not available"),
    ("sbatch: error: Batch job submission failed: Invalid feature specification",
     "sbatch refused the sweep (hydra.launcher.constraint=big): Invalid feature specification"),
    ("sbatch: error: Batch job submission failed: Access/permission denied",
     "sbatch refused the sweep: Access/permission denied"),
])
def test_sbatchs_refusal_is_one_line_naming_the_setting(stderr, line):
    params = {"partition": "gpu", "gpus_per_node": 1, "mem_gb": 64, "constraint": "big"}
    assert sbatch_refusal(stderr, params) == line


def test_the_state_table_counts_each_state():
    text = format_states("7", [("0", "7_0", "COMPLETED", "20", "a.out"), ("1", "7_1", "CANCELLED", "3", "b.out"),
                               ("2", "7_2", "COMPLETED", "20", "c.out")])
    assert text.splitlines()[0] == "[andrea-exp] SLURM array 7: 2 COMPLETED, 1 CANCELLED"
    assert text.splitlines()[3].split() == ["1", "7_1", "CANCELLED", "3", "b.out"]


@pytest.fixture
def job_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SUBMITIT_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "40")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "andrea")
    return monkeypatch


def test_a_requeued_job_continues_the_cell_it_began_and_no_other(tmp_path, job_env):
    cell, other = tmp_path / "1", tmp_path / "2"
    cell.mkdir(), other.mkdir()
    slurm_job.claim(cell)
    assert (cell / slurm_job.OWNER_FILE).read_text() == "andrea:40_1\n"
    assert not slurm_job.requeued_into(cell)  # the first start of the job: not a requeue
    job_env.setenv("SLURM_RESTART_COUNT", "2")
    assert slurm_job.requeued_into(cell)
    assert not slurm_job.requeued_into(other)  # a directory this job never claimed
    job_env.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert not slurm_job.requeued_into(cell)  # another task of the same array
    job_env.setenv("SLURM_ARRAY_TASK_ID", "1")
    job_env.setenv("SUBMITIT_EXECUTOR", "local")
    assert not slurm_job.requeued_into(cell)  # not a SLURM job
    slurm_job.release(cell)
    job_env.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert not slurm_job.requeued_into(cell)  # the run ended: nothing to continue


def test_the_time_limit_signal_is_a_stop_request_and_hands_back_to_submitits_handler(monkeypatch):
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    handed = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: handed.append(signum))  # as submitit's
    limit = time_limit.TimeLimit()
    try:
        limit.take()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert limit.signum == signal.SIGUSR2 and handed == []  # recorded, submitit not yet called
        monkeypatch.setattr(time_limit, "TIME_LIMIT", limit)
        assert time_limit.status_of(signal.SIGUSR2) == "timeout"
        assert time_limit.status_of(signal.SIGTERM) == "interrupted"
        limit.hand_back()
        assert handed == [signal.SIGUSR2]  # after the stop is written, submitit requeues
        limit.ignore_from_now()
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN  # kept while Python exits, unlike a handler
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_a_run_stopped_for_its_time_limit_is_named_so_by_the_guard():
    held = run_guard.Holding(run_guard.RESUMABLE, "timeout", 300)
    assert run_guard.describe(held) == "a run stopped for its time limit at step 300"


def test_an_sbatch_option_without_a_field_is_refused_with_the_way_to_add_it():
    from andrea_exp.config.schema import CONF_DIR
    from andrea_exp.config.validation import command_line_error

    argv = ["-m", "hydra/launcher=slurm", "hydra.launcher.additional_parameters.comment=x"]
    assert command_line_error(argv, CONF_DIR) == (
        "hydra.launcher.additional_parameters.comment is not a setting; hydra.launcher.additional_parameters starts "
        "empty: add a key to it with +hydra.launcher.additional_parameters.comment=VALUE")
    assert command_line_error(["-m", "hydra/launcher=slurm", "+hydra.launcher.additional_parameters.comment=x"],
                              CONF_DIR) is None
