"""The Hydra app end to end, as a user runs it: `python -m andrea_exp ...` in a subprocess."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from andrea_exp.model.decoder import Andrea, ModelConfig

SUMMARY_LINE = re.compile(r"held-out loss (\S+) \| floor (\S+) \| log V (\S+) \(uniform guess\)")


def read_run(run_dir: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((run_dir / "summary.json").read_text())


def printed_losses(stdout: str) -> tuple[float, float, float]:
    found = SUMMARY_LINE.search(stdout)
    assert found, stdout
    return tuple(float(x) for x in found.groups())


def test_five_steps_write_metrics_and_summary(cli, run_dir):
    done = cli("train.max_steps=5", "probe.every=0", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    records, summary = read_run(run_dir)
    assert summary["run/status"] == "finished" and summary["run/steps"] == 5
    train_steps = [r["step"] for r in records if "train/loss" in r]
    assert train_steps == [0, 1, 2, 3, 4]
    assert all(math.isfinite(r["train/loss"]) for r in records if "train/loss" in r)
    assert summary["config"]["train"]["max_steps"] == 5 and summary["config"]["probe"]["every"] == 0
    assert summary["data/log_vocab"] == pytest.approx(math.log(32))
    # the printed line puts the held-out loss beside the floor and log V, as in summary.json
    loss, floor, log_v = printed_losses(done.stdout)
    assert loss == pytest.approx(summary["eval/loss_as_trained"], abs=6e-5)
    assert floor == pytest.approx(summary["eval/floor"], abs=6e-5)
    assert log_v == pytest.approx(math.log(32), abs=6e-5)
    assert floor < loss  # five steps: far from the floor
    evals = [r for r in records if "eval/loss_as_trained" in r]
    assert evals and evals[-1]["step"] == 5
    assert evals[-1]["eval/loss_as_trained"] == summary["eval/loss_as_trained"]  # same number in both files


def test_huge_d_k_unscaled_unmasked_runs(cli, run_dir):
    """d_k 4096 on andrea_tiny takes the explicit path; no mask means the generation loss needs one
    forward per prefix, so the held-out set and the batch are cut to keep this quick."""
    done = cli("model.d_k=4096", "model.scale=false", "model.causal=false", "train.max_steps=5", "probe.every=0",
               "data.eval_sequences=4", "train.sample_tokens=4", "train.batch_size=8", f"hydra.run.dir={run_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    _, summary = read_run(run_dir)
    assert summary["run/status"] == "finished"
    model = summary["config"]["model"]
    assert (model["d_k"], model["scale"], model["causal"], model["d_v"]) == (4096, "none", False, 16)  # one spelling
    expected_params = Andrea(ModelConfig(vocab_size=32, block_size=64, d_model=64, n_layer=2, n_head=4, d_k=4096,
                                         d_v=16)).num_params()
    assert summary["model/params"] == expected_params
    assert summary["eval/gap"] == pytest.approx(summary["eval/loss_generation"] - summary["eval/loss_as_trained"])
    assert summary["eval/loss_generation"] != summary["eval/loss_as_trained"]  # measured separately, not copied
    loss, floor, _ = printed_losses(done.stdout)
    assert loss == pytest.approx(summary["eval/loss_as_trained"], abs=6e-5)


def test_bad_setting_is_one_line_naming_it(cli, run_dir):
    done = cli("model.scale=maybe", "train.max_steps=5", f"hydra.run.dir={run_dir}")
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "model.scale" in errors[0] and "sqrt, none, inv, true, false" in errors[0], errors
    assert "Traceback" not in done.stderr


def test_console_script_is_installed():
    exe = shutil.which("andrea-exp", path=str(Path(sys.executable).parent))
    assert exe, "andrea-exp is not on the virtualenv's PATH"
    done = subprocess.run([exe, "--cfg", "job", "model.d_k=128"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "d_k: 128" in done.stdout


def test_the_run_line_says_where_the_loop_time_went(capsys, tmp_path):
    from andrea_exp.launch.cli import print_run_summary

    summary = {"run/status": "finished", "run/steps": 1000, "run/wall_s": 17.26, "run/time/setup_s": 8.7,
               "run/time/steps_s": 14.05, "run/time/probes_s": 1.87, "run/time/evals_s": 0.13, "run/time/maps_s": 1.22,
               "run/time/checkpoints_s": 0.0, "run/time/end_s": 0.43}
    print_run_summary(summary, tmp_path)
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("[andrea-exp] finished after 1000 steps in 17.3 s "
                     "(steps 14.1 s, probes 1.9 s, evals 0.1 s, maps 1.2 s)")
    print_run_summary({"run/status": "diverged", "run/steps": 3, "run/wall_s": 0.5}, tmp_path)  # an older summary
    assert capsys.readouterr().out.splitlines()[0] == "[andrea-exp] diverged after 3 steps in 0.5 s"


def test_a_sweeps_launching_process_never_imports_torch():
    """The process that composes, validates and launches a sweep's cells reads the settings' allowed values
    from a torch-free module, and the cells' results it unpickles hold plain values, so it never spends the
    seconds torch takes to import before the first cell starts (the cells import torch themselves)."""
    script = """
import sys
from hydra import compose, initialize_config_dir
import andrea_exp.launch.cli, andrea_exp.launch.mps, andrea_exp.launch.sweep
from andrea_exp.config.validation import validate
from andrea_exp.config.schema import CONF_DIR
with initialize_config_dir(str(CONF_DIR), version_base=None):
    for overrides in (["experiment=claims_grid", "model.d_k=4096", "model.scale=false"], ["model.attn_impl=bilinear"]):
        validate(compose("config", overrides=overrides))
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_run_facts_hold_plain_values(tmp_path):
    """A cell's summary travels back to the launching process by pickle: no torch type may be in it."""
    import torch

    from andrea_exp.training.runfacts import run_facts
    from andrea_exp.training.runtime import Runtime

    model = Andrea(ModelConfig(vocab_size=32, block_size=8, d_model=16, n_layer=1, n_head=2, d_k=8, d_v=8))
    facts = run_facts(Runtime(torch.device("cpu")), model, 32)
    assert facts["system/torch"] == torch.__version__
    assert {key: type(value).__module__ for key, value in facts.items() if value is not None} == {
        key: "builtins" for key, value in facts.items() if value is not None}
