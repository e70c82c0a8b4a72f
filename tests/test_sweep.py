"""Multiruns as users type them: W&B group and names per cell, the end table, failing cells, presets."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import compose_config
from omegaconf import OmegaConf
from test_tracking import WANDB, charted, read_run

from andrea_exp.runs.metric_keys import layer_of
from andrea_exp.runs.naming import describe, run_name, sweep_name, swept_keys
from andrea_exp.runs.table import format_table

TINY = ["train.max_steps=20", "data.seq_len=32", "probe.every=10", "train.eval_every=10", "probe.maps_every=0",
        "train.log_every=5", "data.train_sequences=512", "data.eval_sequences=32", "train.batch_size=8",
        "logger.mode=offline"]


def wandb_env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb-default"),
               WANDB_SILENT="true", WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), NETRC=str(tmp_path / "no-netrc"))
    return env


def multirun(tmp_path: Path, *overrides: str) -> tuple[subprocess.CompletedProcess, Path]:
    sweep_dir = tmp_path / "sweeps" / "grid"
    proc = subprocess.run([sys.executable, "-m", "andrea_exp", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"],
                          cwd=tmp_path, env=wandb_env(tmp_path), capture_output=True, text=True, timeout=600)
    return proc, sweep_dir


def test_run_names_and_tags_come_from_the_cell_in_the_configs_words():
    task = ["experiment=claims_grid", "model.d_k=64,256", "train.max_steps=20", "model.causal=true,false"]
    assert swept_keys(task, {"model.scale": "true,false"}) == {"model.d_k", "model.causal", "model.scale"}
    assert run_name([("model.d_k", "8"), ("probe.d_k", "2")]) == "model.d_k=8 probe.d_k=2"  # ambiguous: kept whole
    # the overrides as a sweep's job records them: the preset's name, a scientific and an operational setting
    overrides = ["experiment=claims_grid", "model.scale=False", "model.qk_init=gpt2", "train.lr=1e-2", "seed=2",
                 "logger.mode=offline"]
    cfg = compose_config(*overrides, "model.d_k=64", "train.max_steps=20")
    named = describe(cfg, overrides, sweep="claims_grid-2026-12-01_10-00-00", extra_tags=["mine"])
    assert named.run_name == "d_k=64 scale=none causal=true qk_init=gpt2 lr=0.01 seed=2"
    assert named.tags == ["d_k=64", "scale=none", "causal=true", "qk_init=gpt2", "lr=0.01", "seed=2",
                          "sweep=claims_grid-2026-12-01_10-00-00", "mine"]
    assert named.group.startswith("d_k=64 scale=none causal=true qk_init=gpt2 lr=0.01 #")
    assert describe(OmegaConf.merge(cfg, {"seed": 5}), overrides).group == named.group  # a replicate
    other_steps = describe(OmegaConf.merge(cfg, {"train": {"max_steps": 40}}), overrides).group
    assert other_steps != named.group  # a scientific setting the name leaves out still splits the cells
    assert describe(OmegaConf.merge(cfg, {"logger": {"mode": "online"}}), overrides).group == named.group


def test_a_sweep_is_named_by_its_experiment_or_its_axes_and_its_time(tmp_path):
    stamped = tmp_path / "multirun" / "claims_grid" / "2026-12-01_10-00-00"
    stamped.mkdir(parents=True)
    (stamped / "multirun.yaml").write_text("name: claims_grid\nhydra:\n  overrides:\n    task: ['model.d_k=8,16']\n")
    assert sweep_name(stamped) == "claims_grid-2026-12-01_10-00-00"
    typed = tmp_path / "mine"
    typed.mkdir()
    (typed / "multirun.yaml").write_text("name: default\nhydra:\n  overrides:\n"
                                         "    task: ['train.lr=0.1,0.01', 'seed=0,1']\n")
    assert sweep_name(typed) == "sweep_lr_seed-mine"  # no experiment: its swept keys, and the directory's name


def test_table_lists_every_cell_and_why_it_failed(tmp_path):
    cells = [{"dir": tmp_path / "0", "overrides": "model.d_k=8",
              "summary": {"run/status": "finished", "eval/loss_as_trained": 1.5, "eval/gap": 0.0,
                          "attn/entropy": 2.25}},
             {"dir": tmp_path / "1", "overrides": "model.d_k=0",
              "summary": {"run/status": "failed", "run/error": "model.d_k must be an integer >= 1; got 0"}},
             {"dir": tmp_path / "2", "overrides": "model.d_k=9", "summary": {"run/status": "missing"}}]
    cells[0]["wandb_id"] = "ab12cd34"
    lines = format_table(cells).splitlines()
    assert lines[0].split() == ["cell", "overrides", "status", "final", "loss", "gap", "entropy", "W&B", "id"]
    assert lines[1].split() == ["0", "model.d_k=8", "finished", "1.5000", "0.0000", "2.2500", "ab12cd34"]
    assert lines[2].split() == ["1", "model.d_k=0", "failed", "-", "-", "-", "-"]
    assert "cell 1 failed: model.d_k must be an integer >= 1; got 0" in lines[-2]
    assert "cell 2: no summary.json" in lines[-1]


@pytest.mark.slow
def test_four_cell_multirun_logs_four_groups_four_names_and_the_contract_keys(tmp_path):
    proc, sweep_dir = multirun(tmp_path, "model.d_k=8,16", "model.causal=true,false", *TINY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wandb sync {sweep_dir}/wandb" in proc.stdout
    assert "4 cells, 0 failed" in proc.stdout
    runs = [read_run(next((sweep_dir / str(i) / "wandb").glob("offline-run-*"))) for i in range(4)]
    assert len({r["run"]["run_group"] for r in runs}) == 4  # four cells, never averaged together
    names = [r["run"]["display_name"].split(" ")[:3] for r in runs]
    assert names == [["d_k=8", "scale=sqrt", "causal=true"], ["d_k=8", "scale=sqrt", "causal=false"],
                     ["d_k=16", "scale=sqrt", "causal=true"], ["d_k=16", "scale=sqrt", "causal=false"]]
    for i, (run, (d_k, causal)) in enumerate(zip(runs, [(8, True), (8, False), (16, True), (16, False)])):
        assert run["state"] == "finished" and run["summary"]["run/status"] == "finished"
        model = run["config"]["model"]
        assert (model["d_k"], model["scale"], model["causal"]) == (d_k, "sqrt", causal)
        assert {"train/loss", "attn/entropy", "grad/norm", "eval/gap", "train/step"} <= run["keys"]
        assert f"causal={str(causal).lower()}" in run["run"]["tags"]
        steps = [h["train/step"] for h in run["history"] if "train/loss" in h]
        assert steps == list(range(20))
        assert [h["train/step"] for h in run["history"] if "eval/loss_as_trained" in h] == [0, 10, 20]
        # the same numbers in W&B and in metrics.jsonl
        local = [json.loads(line) for line in (sweep_dir / str(i) / "metrics.jsonl").read_text().splitlines()]
        local_loss = [r["train/loss"] for r in local if "train/loss" in r]
        assert [h["train/loss"] for h in run["history"] if "train/loss" in h] == pytest.approx(local_loss)
    table = proc.stdout[proc.stdout.index("cell  overrides"):]
    assert "model.d_k=16 model.causal=false  finished" in table


FEW = ["train.max_steps=4", "data.seq_len=16", "probe.every=2", "train.eval_every=2", "probe.maps_every=100",
       "train.log_every=2", "data.train_sequences=64", "data.eval_sequences=16", "train.batch_size=4",
       "logger.mode=offline"]


@pytest.mark.slow
def test_a_sweep_opens_and_syncs_in_wandb_as_one_unit(tmp_path):
    proc, sweep_dir = multirun(tmp_path, "train.lr=0.001,0.01", "seed=0,1", *FEW)
    assert proc.returncode == 0, proc.stderr[-3000:]
    links = sweep_dir / "wandb"
    dry = subprocess.run([WANDB, "sync", "--dry-run", str(links)], capture_output=True, text=True, check=True,
                         env=wandb_env(tmp_path))
    assert "Would sync 4 run(s)" in dry.stdout + dry.stderr
    runs = [read_run(path) for path in sorted(links.iterdir())]  # W&B's reader, through the sweep's folder
    by_group = {}
    for run in runs:
        by_group.setdefault(run["run"]["run_group"], []).append(run)
    assert sorted(len(members) for members in by_group.values()) == [2, 2]  # two cells of two seeds each
    for members in by_group.values():
        assert len({r["config"]["train"]["lr"] for r in members}) == 1  # one cell: its seeds only
        assert sorted(r["config"]["seed"] for r in members) == [0, 1]
    fixed = "max_steps=4 seq_len=16 train_sequences=64 eval_sequences=16 batch_size=4"
    assert sorted(r["run"]["display_name"] for r in runs) == sorted(
        f"d_k=16 scale=sqrt causal=true lr={lr} {fixed} seed={seed}" for lr in ("0.001", "0.01") for seed in (0, 1))
    sweep = runs[0]["config"]["sweep_name"]
    assert sweep == "sweep_lr_seed-grid"  # no experiment: its swept keys, and hydra.sweep.dir's name
    for run in runs:
        assert f"sweep={sweep}" in run["run"]["tags"] and run["run"]["job_type"] == "train"
        per_layer = {k for k in run["keys"] if layer_of(k) is not None}
        assert {"attn/L0/entropy", "attn/L1/entropy", "grad/L1/q"} <= per_layer  # logged ...
        assert not {k for k in charted(run) if layer_of(k) is not None}  # ... and out of the automatic charts
        assert {"train/loss", "eval/loss_as_trained", "attn/entropy"} <= charted(run)
        assert not {"eval/floor", "eval/floor_se"} & charted(run)
        evals = [h["train/step"] for h in run["history"] if "eval/loss_as_trained" in h]
        assert evals == [0, 2, 4]  # from the start of training
        maps = [h["train/step"] for h in run["history"] if "attn_map/L1._type" in h]
        assert maps == [0, 4]  # the first and the last step, though probe.maps_every exceeds the run
        assert set(run["summary"]["eval/loss_as_trained"]) == {"min", "last"}
        assert run["summary"]["best/eval/step"] in (0, 2, 4)
        lr, seed = run["config"]["train"]["lr"], run["config"]["seed"]
        assert run["environment"]["args"][:2] == [f"train.lr={lr}", f"seed={seed}"]  # the cell's own command line
        assert "[andrea-exp] finished after 4 steps" in run["console"]  # the results, in W&B's console log
        assert "held-out loss" in run["console"]
    table = proc.stdout[proc.stdout.index("cell  overrides"):]
    for i in range(4):
        run_id = (sweep_dir / str(i) / "wandb_run_id").read_text().strip()
        assert re.search(rf"^{i} .* {run_id}$", table, flags=re.M)  # each cell's W&B id in the table
    assert table.index(f"wandb sync {links}") > table.index("cell  overrides")  # the commands follow the table
    assert f"wandb leet {links}" in table


# A pair of values that is only bad together: each value passes the check before the sweep starts (every value
# is composed with the other axes' first values), so the bad combination is found when its cell runs.
BAD_PAIR = ["data.seq_len=16,64", "model.block_size=64,32"]  # cell 3: seq_len 64 > block_size 32


@pytest.mark.slow
def test_a_bad_cell_fails_alone_and_the_exit_code_says_so(tmp_path):
    tiny = [o for o in TINY if not o.startswith("data.seq_len=")]
    proc, sweep_dir = multirun(tmp_path, *BAD_PAIR, *tiny)
    assert proc.returncode == 1
    assert "4 cells, 1 failed" in proc.stdout
    assert "cell 3 failed: data.seq_len (64) must be <= model.block_size (32)" in proc.stdout
    for good in ("0", "1", "2"):
        assert json.loads((sweep_dir / good / "summary.json").read_text())["run/status"] == "finished"
        run = read_run(next((sweep_dir / good / "wandb").glob("offline-run-*")))
        assert run["state"] == "finished"
    assert json.loads((sweep_dir / "3" / "summary.json").read_text())["run/status"] == "failed"
    assert not (sweep_dir / "3" / "wandb").exists()  # rejected before any run was opened


@pytest.mark.slow
def test_a_bad_swept_value_stops_the_sweep_before_any_cell(tmp_path):
    proc, sweep_dir = multirun(tmp_path, "model.d_k=16,0,32", *TINY)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: model.d_k must be an integer >= 1; got 0 (sweep value model.d_k=0)"
    assert not sweep_dir.exists()


@pytest.mark.slow
def test_a_cell_that_raises_while_training_is_failed_in_wandb(tmp_path):
    # a real I/O error inside the training loop: cell 0's checkpoints/ is taken by a file, so the save raises
    blocked = tmp_path / "sweeps" / "grid" / "0" / "checkpoints"
    blocked.parent.mkdir(parents=True)
    blocked.write_text("not a directory")
    proc, sweep_dir = multirun(tmp_path, "model.d_k=8,16", *TINY)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "2 cells, 1 failed" in proc.stdout
    bad = read_run(next((sweep_dir / "0" / "wandb").glob("offline-run-*")))
    assert bad["state"] == "failed" and bad["exit_code"] == 1 and bad["summary"]["run/status"] == "failed"
    assert "train/loss" in bad["keys"]  # it trained, then failed
    good = read_run(next((sweep_dir / "1" / "wandb").glob("offline-run-*")))
    assert good["state"] == "finished" and good["run"]["run_id"] != bad["run"]["run_id"]
    assert len(good["history"]) < len(bad["history"]) + 5
    assert good["run"]["display_name"].startswith("d_k=16 scale=sqrt causal=true")
    assert "Error" in json.loads((sweep_dir / "0" / "summary.json").read_text())["run/error"]


@pytest.mark.parametrize("name,cells", [("claims_grid", 36), ("leak_gap", 6), ("qk_init", 36),
                                        ("scaling_at_init", 90), ("lr_sensitivity", 108), ("extras", 72)])
def test_experiment_presets_compose(name, cells):
    cfg = compose_config(f"experiment={name}", hydra=True)
    assert cfg.name == name and cfg.model.name == "andrea_small"
    params = cfg.hydra.sweeper.params
    count = 1
    for values in params.values():
        count *= len(str(values).split("#")[0].split(","))
    assert count == cells
    if name == "claims_grid":
        assert dict(params) == {"model.d_k": "64,256,4096", "model.scale": "true,false",
                                "model.causal": "true,false", "seed": "0,1,2"}


def test_the_chapter_scale_preset_is_andrea_120m_at_t_1024_on_prepared_tokens():
    cfg = compose_config("experiment=claims_120m", hydra=True)
    assert cfg.name == "claims_120m" and cfg.model.name == "andrea_120m"
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.n_head) == (768, 12, 12)
    assert cfg.data.name == "tokens" and cfg.data.seq_len == 1024 <= cfg.model.block_size
    assert cfg.data.vocab_size is None  # meta.json's
    assert cfg.train.generation_sequences == 8 and cfg.train.attn_stats == "every"
    # seed first: it varies slowest, so every cell's seed 0 runs before any seed 1
    assert list(cfg.hydra.sweeper.params) == ["seed", "model.d_k", "model.scale", "model.causal"]
    assert dict(cfg.hydra.sweeper.params) == {"seed": "0,1,2", "model.d_k": "64,256", "model.scale": "true,false",
                                              "model.causal": "true,false"}
    # sized never to repeat its data on the corpus it is made for: at most one pass over 20M training tokens
    tokens_seen = cfg.train.max_steps * cfg.train.batch_size * cfg.data.seq_len
    assert cfg.train.max_steps >= 1000 and tokens_seen <= 20_000_000


@pytest.mark.slow
def test_scaling_at_init_runs_only_the_final_probe_and_eval(tmp_path):
    proc, sweep_dir = multirun(tmp_path, "experiment=scaling_at_init", "model=andrea_tiny", "data.seq_len=32",
                               "model.d_k=8,64", "model.qk_init=unit", "seed=0",  # the command line wins
                               "data.train_sequences=512", "data.eval_sequences=32", "probe.maps_every=0",
                               "logger.mode=offline")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 cells, 0 failed" in proc.stdout
    stds = {}
    for i in range(4):
        summary = json.loads((sweep_dir / str(i) / "summary.json").read_text())
        assert summary["run/steps"] == 0 and summary["run/status"] == "finished"
        assert "eval/loss_as_trained" in summary and "attn/score_std" in summary
        stds[(summary["config"]["model"]["d_k"], summary["config"]["model"]["scale"])] = summary["attn/score_std"]
    # unscaled scores grow with d_k, scaled ones do not (claims C2, C5): 8x the width, about sqrt(8) the spread;
    # the summaries spell model.scale one way (the preset types true / false)
    assert stds[(64, "none")] / stds[(8, "none")] > 2.0
    assert stds[(64, "sqrt")] / stds[(8, "sqrt")] < 1.6


def andrea_imports(module: str) -> set[str]:
    """The andrea_exp modules (last name of the dotted path) a module of the package imports, at any depth."""
    tree = ast.parse((Path(__file__).resolve().parent.parent / "andrea_exp" / f"{MODULES[module]}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("andrea_exp"):
            if node.module.count(".") <= 1:  # from andrea_exp.runs import rundir: the modules named
                found.update(alias.name for alias in node.names)
            else:
                found.add(node.module.split(".")[-1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[-1] for a in node.names if a.name.startswith("andrea_exp."))
    return found


MODULES = {"metric_keys": "runs/metric_keys", "rundir": "runs/rundir", "naming": "runs/naming",
           "tracking": "runs/tracking", "table": "runs/table", "runs": "runs/frame", "sweep": "launch/sweep"}


def test_imports_run_one_way_rundir_naming_tracking_table_runs_sweep():
    order = ["metric_keys", "rundir", "naming", "tracking", "table", "runs", "sweep"]  # each imports only earlier ones
    for i, module in enumerate(order[1:], start=1):
        later = andrea_imports(module) & set(order[i:])
        assert not later, f"andrea_exp.{module} imports {sorted(later)}, which come after it"
    assert andrea_imports("tracking") == {"metric_keys", "naming", "rundir", "timeline"}  # timeline: a leaf of runs
    assert {"tracking", "table"} <= andrea_imports("sweep") and "table" in andrea_imports("runs")
