"""The sweep's W&B workspace is built (sections, panels, keys, group filter) without a login or a save."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from andrea_exp.runs.metric_keys import ATTN_JAC_NORM, ATTN_QK_SPECTRAL, GRAD_NORM, GRAD_SCORES_DEAD_FRAC, METRICS
from andrea_exp.runs.workspace import AXES, TARGET, build_workspace

# optional dependency (the `workspace` extra): without it this file skips instead of breaking collection
wr = pytest.importorskip("wandb_workspaces.reports.v2")


def panels(workspace, section_name: str):
    (section,) = [s for s in workspace.sections if s.name == section_name]
    return section.panels


def test_sections_panels_and_keys():
    w = build_workspace("team", "andrea-exp", "claims_grid-2026-05-01_12-00-00")
    assert (w.entity, w.project, w.name) == ("team", "andrea-exp", "sweep claims_grid-2026-05-01_12-00-00")
    assert [s.name for s in w.sections] == ["Loss by d_k, scale and mask", "Loss per cell", "Attention over steps",
                                            "Attention of the training batch, every step", "Gradients",
                                            "Train-inference gap", "Axes -> loss"]
    grouped = panels(w, "Loss by d_k, scale and mask")
    assert [(p.y, p.groupby.name) for p in grouped] == [
        (["train/loss"], "model.d_k"), (["train/loss"], "model.scale"), (["train/loss"], "model.causal"),
        ([TARGET], "model.d_k"), ([TARGET], "model.scale"), ([TARGET], "model.causal")]
    every_line = [p for s in w.sections for p in s.panels if isinstance(p, wr.LinePlot)]
    assert {p.x for p in every_line} == {"train/step"}  # one step axis everywhere
    attention = [p.y[0] for p in panels(w, "Attention over steps")]
    assert attention == [m.key for m in METRICS if m.key.startswith("attn/") and not m.key.startswith("attn/L")]
    assert {"attn/entropy", "attn/max_prob", ATTN_JAC_NORM, ATTN_QK_SPECTRAL} <= set(attention)
    step_attention = [p.y for p in panels(w, "Attention of the training batch, every step")]
    pooled_step = [m.key for m in METRICS if m.key.startswith("attn_step/")]
    assert step_attention[:len(pooled_step)] == [[key] for key in pooled_step]
    assert step_attention[len(pooled_step):] == [[key.replace("/", f"/L{li}/", 1) for li in range(12)]
                                                 for key in pooled_step]  # one line per layer
    assert "attn_step/score_max" in pooled_step
    gradients = {p.y[0]: p.log_y for p in panels(w, "Gradients")}
    assert all("{" not in key and key.startswith("grad/") for key in gradients)  # pooled keys only
    assert gradients[GRAD_NORM] is True and gradients["grad/scores"] is True
    assert gradients[GRAD_SCORES_DEAD_FRAC] is None  # a share of rows is often 0: a linear axis shows it
    assert len(gradients) == sum(m.key.startswith("grad/") and "{" not in m.key for m in METRICS)
    gap = panels(w, "Train-inference gap")
    assert [p.metrics for p in gap if isinstance(p, wr.BarPlot)] == [["eval/gap"], ["eval/below_floor"]]
    (parallel,) = panels(w, "Axes -> loss")
    assert isinstance(parallel, wr.ParallelCoordinatesPlot)
    columns = [(type(c.metric).__name__, c.metric.name) for c in parallel.columns]
    assert columns == [("Config", "model.d_k"), ("Config", "model.scale"), ("Config", "model.causal"),
                       ("SummaryMetric", TARGET)]
    assert list(AXES.values()) == ["model.d_k", "model.scale", "model.causal"]


def test_the_sweep_filter_and_the_saved_form():
    w = build_workspace("team", "andrea-exp", "leak_gap-2026-05-01_12-00-00")
    view = json.loads(w._to_model().model_dump_json())  # what .save() would send, built offline
    text = json.dumps(view)
    run_set = view["spec"]["section"]["run_sets"][0]
    assert run_set["filters"]["filters"] == [{"key": {"section": "run", "name": "group"}, "op": "=",
                                              "value": "leak_gap-2026-05-01_12-00-00", "disabled": False}]
    assert '"group_by": "model.value.d_k"' in text and '"x_axis": "train/step"' in text
    assert '"eval/gap"' in text and f'"{TARGET}"' in text


def test_console_command_prints_without_saving(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env["HOME"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "andrea_exp.runs.workspace", "--entity", "E", "--project", "P",
                           "--group", "G"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "workspace 'sweep G' for E/P" in proc.stdout
    assert "ParallelCoordinatesPlot: d_k, scale, mask -> eval/loss_as_trained" in proc.stdout
    assert "not saved" in proc.stdout
