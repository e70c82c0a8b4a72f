"""The sweep's W&B workspace is built (sections, panels, keys, group filter) without a login or a save."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from andrea_exp.runs.metric_keys import ATTN_JAC_NORM, ATTN_QK_SPECTRAL, GRAD_NORM, GRAD_SCORES_DEAD_FRAC, METRICS
from andrea_exp.runs.workspace import AXES, TARGET, build_workspace, read_sweep

# optional dependency (the `workspace` extra): without it this file skips instead of breaking collection
wr = pytest.importorskip("wandb_workspaces.reports.v2")


def panels(workspace, section_name: str):
    (section,) = [s for s in workspace.sections if s.name == section_name]
    return section.panels


def test_sections_panels_and_keys():
    w = build_workspace("team", "andrea-exp", "claims_grid-2026-05-01_12-00-00")
    assert (w.entity, w.project, w.name) == ("team", "andrea-exp", "sweep claims_grid-2026-05-01_12-00-00")
    assert [s.name for s in w.sections] == [
        "Loss by d_k, scale and mask", "Loss per cell", "Attention of the probe batch",
        "Attention of the training batch, every step", "Gradients", "Train-inference gap",
        "Attention of the probe batch, per layer", "Attention of the training batch, per layer",
        "Gradients per layer", "Axes -> loss"]
    grouped = panels(w, "Loss by d_k, scale and mask")
    assert [(p.y, p.groupby.name) for p in grouped] == [
        (["train/loss"], "model.d_k"), (["train/loss"], "model.scale"), (["train/loss"], "model.causal"),
        ([TARGET], "model.d_k"), ([TARGET], "model.scale"), ([TARGET], "model.causal")]
    every_line = [p for s in w.sections for p in s.panels if isinstance(p, wr.LinePlot)]
    assert {p.x for p in every_line} == {"train/step"}  # one step axis everywhere
    attention = [p.y[0] for p in panels(w, "Attention of the probe batch")]
    assert attention == [m.key for m in METRICS if m.key.startswith("attn/") and not m.key.startswith("attn/L")]
    assert {"attn/entropy", "attn/max_prob", ATTN_JAC_NORM, ATTN_QK_SPECTRAL} <= set(attention)
    pooled_step = [m.key for m in METRICS if m.key.startswith("attn_step/")]
    assert [p.y for p in panels(w, "Attention of the training batch, every step")] == [[k] for k in pooled_step]
    assert [p.y for p in panels(w, "Attention of the training batch, per layer")] == [
        [key.replace("/", f"/L{li}/", 1) for li in range(12)] for key in pooled_step]  # one line per layer
    top_level = [key for s in w.sections[:6] for p in s.panels if isinstance(p, wr.LinePlot) for key in p.y]
    assert not [key for key in top_level if "/L" in key]  # per-layer series only in their own sections
    gradients = {p.y[0]: p.log_y for p in panels(w, "Gradients")}
    assert all("{" not in key and key.startswith("grad/") for key in gradients)  # pooled keys only
    assert gradients[GRAD_NORM] is True and gradients["grad/scores"] is True
    assert gradients[GRAD_SCORES_DEAD_FRAC] is None  # a share of rows is often 0: a linear axis shows it
    assert len(gradients) == sum(m.key.startswith("grad/") and "{" not in m.key for m in METRICS)
    (query,) = [p.y for p in panels(w, "Gradients per layer") if p.title == "grad/L*/q per layer"]
    assert query[::11] == ["grad/L0/q", "grad/L11/q"]
    gap = panels(w, "Train-inference gap")
    assert [p.metrics for p in gap if isinstance(p, wr.BarPlot)] == [["eval/gap"], ["eval/below_floor"]]
    (parallel,) = panels(w, "Axes -> loss")
    assert isinstance(parallel, wr.ParallelCoordinatesPlot)
    columns = [(type(c.metric).__name__, c.metric.name) for c in parallel.columns]
    assert columns == [("Config", "model.d_k"), ("Config", "model.scale"), ("Config", "model.causal"),
                       ("SummaryMetric", "best/eval/loss_as_trained")]
    assert list(AXES.values()) == ["model.d_k", "model.scale", "model.causal"]


def test_the_sweep_filter_the_cell_grouping_and_the_saved_form():
    w = build_workspace("team", "andrea-exp", "leak_gap-2026-05-01_12-00-00")
    view = json.loads(w._to_model().model_dump_json())  # what .save() would send, built offline
    text = json.dumps(view)
    run_set = view["spec"]["section"]["run_sets"][0]
    assert run_set["filters"]["filters"] == [{"key": {"section": "config", "name": "sweep_name"}, "op": "=",
                                              "value": "leak_gap-2026-05-01_12-00-00", "disabled": False}]
    assert run_set["grouping"] == [{"section": "run", "name": "group"}]  # a cell's seeds draw one mean line
    assert '"group_by": "model.value.d_k"' in text and '"x_axis": "train/step"' in text
    assert '"eval/gap"' in text and f'"{TARGET}"' in text


def write_sweep(root: Path, layers: int, keys: list[str]) -> Path:
    """A sweep directory as a run leaves it: multirun.yaml, job directories with .hydra/, summary and metrics."""
    sweep = root / "multirun" / "leak_gap" / "2026-05-01_12-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("name: leak_gap\nhydra:\n  overrides:\n    task: ['seed=0,1']\n")
    for cell in ("0", "1"):
        (sweep / cell / ".hydra").mkdir(parents=True)
        config = {"model": {"n_layer": layers}, "logger": {"project": "mine", "entity": "lab"}}
        (sweep / cell / "summary.json").write_text(json.dumps({"run/status": "finished", "config": config}))
        (sweep / cell / "metrics.jsonl").write_text(json.dumps({"step": 0, **{k: 1.0 for k in keys}}) + "\n")
    return sweep


def test_a_workspace_is_found_from_the_sweep_directory_with_only_what_the_runs_logged(tmp_path):
    logged = ["train/loss", "eval/loss_as_trained", "attn/entropy", "attn/L0/entropy", "attn/L1/entropy",
              "grad/norm", "grad/L0/q", "grad/L1/q"]  # no train.attn_stats, no eval/gap
    facts = read_sweep(write_sweep(tmp_path, 2, logged))
    assert (facts.sweep, facts.project, facts.entity, facts.layers) == ("leak_gap-2026-05-01_12-00-00", "mine",
                                                                        "lab", 2)
    w = build_workspace(facts.entity, facts.project, facts.sweep, layers=facts.layers, logged=facts.logged)
    assert [s.name for s in w.sections] == [
        "Loss by d_k, scale and mask", "Loss per cell", "Attention of the probe batch", "Gradients",
        "Attention of the probe batch, per layer", "Gradients per layer", "Axes -> loss"]
    assert [p.y for p in panels(w, "Attention of the probe batch")] == [["attn/entropy"]]
    assert [p.y for p in panels(w, "Attention of the probe batch, per layer")] == [["attn/L0/entropy",
                                                                                    "attn/L1/entropy"]]
    assert [p.y for p in panels(w, "Gradients per layer")] == [["grad/L0/q", "grad/L1/q"]]


def test_console_command_prints_without_saving(tmp_path):
    sweep = write_sweep(tmp_path, 2, ["train/loss", "eval/loss_as_trained"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)
    command = [sys.executable, "-m", "andrea_exp.runs.workspace"]
    proc = subprocess.run([*command, str(sweep)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "workspace 'sweep leak_gap-2026-05-01_12-00-00' for lab/mine" in proc.stdout
    assert "ParallelCoordinatesPlot: d_k, scale, mask -> best/eval/loss_as_trained" in proc.stdout
    assert "not saved" in proc.stdout
    missing = subprocess.run([*command, str(tmp_path / "nothing")], capture_output=True, text=True, env=env,
                             timeout=120)
    assert missing.returncode == 2 and missing.stderr.startswith("error: SWEEP_DIR:")
