"""A W&B workspace for one sweep: loss by d_k / scale / mask, attention peakiness (the probe's, and the training
batch's where train.attn_stats is on), gradients, each per layer in a section of its own, the train-inference gap.

    python -m andrea_exp.runs.workspace SWEEP_DIR [--entity E] [--project P] [--save]

Everything else comes from the sweep directory: the sweep's runs (its name, the `sweep_name` config key of every
run), project and entity (logger.*), the layer count, and the series the runs logged (a section only for those).
Runs are grouped by their W&B group, the cell, so a cell's seeds draw one mean line. Without --save it prints
what it would build (no login needed).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from andrea_exp.runs import rundir
from andrea_exp.runs.metric_keys import (
    ATTN_STEP,
    BEST_EVAL_LOSS,
    EVAL_BELOW_FLOOR,
    EVAL_FLOOR,
    EVAL_GAP,
    EVAL_LOSS_AS_TRAINED,
    EVAL_LOSS_GENERATION,
    METRICS,
    TRAIN_LOSS,
    TRAIN_STEP,
    layer_of,
    per_layer,
)
from andrea_exp.runs.naming import sweep_name
from andrea_exp.runs.tracking import SWEEP_KEY

AXES = {"d_k": "model.d_k", "scale": "model.scale", "mask": "model.causal"}
STEP = TRAIN_STEP  # every chart shares the training step (tracking.py defines it as the step metric)
TARGET = EVAL_LOSS_AS_TRAINED
LINEAR_SUFFIXES = ("_frac", "_share")  # shares of rows: 0 is a real value, which a log axis would hide
GRAD_PARTS = ("q", "k", "v", "o", "mlp")  # grad/L{l}/<part>: one chart each, a line per layer


def pooled_keys(namespace: str) -> tuple[str, ...]:
    """The registry's keys of one namespace pooled over layers (`attn/entropy`, not `grad/L{l}/q`), in its order."""
    return tuple(m.key for m in METRICS if m.key.startswith(namespace + "/") and "{" not in m.key)


def layered_keys(namespace: str) -> tuple[str, ...]:
    """The pooled keys of one namespace that also have a per-layer variant."""
    return tuple(m.key for m in METRICS if m.key.startswith(namespace + "/") and m.per_layer)


ATTENTION_KEYS = pooled_keys("attn")
GRADIENT_KEYS = pooled_keys("grad")
STEP_ATTENTION_KEYS = pooled_keys(ATTN_STEP)  # train.attn_stats: the training batch, every step
DEFAULT_LAYERS = 12  # lines per per-layer chart when no runs say how many layers they have


@dataclass(frozen=True)
class SweepFacts:
    """What a workspace needs to know of a sweep, read from its directory."""
    sweep: str
    project: str
    entity: str | None
    layers: int
    logged: frozenset[str]  # every key the runs logged (metrics.jsonl)


def read_sweep(sweep_dir: Path) -> SweepFacts:
    """The sweep's name, W&B project and entity, layer count and logged keys, from its cells' files."""
    sweep_dir = Path(sweep_dir)
    cells = rundir.job_dirs(sweep_dir) if sweep_dir.is_dir() else []
    if not cells:
        raise FileNotFoundError(f"{sweep_dir} holds no runs of a sweep (no job directory with {rundir.HYDRA_DIR}/)")
    configs = [rundir.read_config(cell) for cell in cells]
    logger = next((c.get("logger") for c in configs if c.get("logger")), {}) or {}
    layers = max((int(c.get("model", {}).get("n_layer") or 0) for c in configs), default=0) or DEFAULT_LAYERS
    logged = frozenset(key for cell in cells for record in rundir.read_metrics(cell) for key in record)
    return SweepFacts(sweep_name(sweep_dir), logger.get("project") or "andrea-exp", logger.get("entity"), layers,
                      logged)


def _line(wr, key: str, *, groupby: str | None = None, title: str | None = None, log_y: bool = False):
    """A line chart of one key over the training step; grouped (mean, min-max band) by a config key if given."""
    extra = {"groupby": wr.Config(groupby), "groupby_aggfunc": "mean", "groupby_rangefunc": "minmax"} if groupby else {}
    return wr.LinePlot(title=title or key, x=STEP, y=[key], log_y=log_y or None, **extra)


def _by_layer(wr, key: str, layers: int, log_y: bool = False):
    """One chart of a pooled key's per-layer variants, a line per layer."""
    return wr.LinePlot(title=f"{key} per layer", x=STEP, y=[per_layer(key, li) for li in range(layers)],
                       log_y=log_y or None)


def _log_y(key: str) -> bool:
    return not key.endswith(LINEAR_SUFFIXES)


def sections_for(wr, ws, layers: int, logged) -> list:
    """The workspace's sections, each holding only panels of keys in `logged` (a section left empty is dropped)."""
    has = logged.__contains__
    has_layers = {key for key in logged if layer_of(key) is not None}

    def layer_keys(keys):  # pooled keys some of whose per-layer variants were logged
        return [k for k in keys if any(per_layer(k, li) in has_layers for li in range(layers))]

    loss_grouped = [_line(wr, key, groupby=config, title=f"{key} by {label}")
                    for key in (TRAIN_LOSS, TARGET) if has(key) for label, config in AXES.items()]
    gradients = [k for k in GRADIENT_KEYS if has(k)]
    grad_parts = [f"grad/L{{l}}/{part}" for part in GRAD_PARTS
                  if any(f"grad/L{li}/{part}" in has_layers for li in range(layers))]
    sections = [
        ("Loss by d_k, scale and mask", True, loss_grouped),
        ("Loss per cell", True, [_line(wr, k) for k in (TRAIN_LOSS, TARGET, EVAL_LOSS_GENERATION, EVAL_FLOOR)
                                 if has(k)]),
        ("Attention of the probe batch", True, [_line(wr, k) for k in ATTENTION_KEYS if has(k)]),
        ("Attention of the training batch, every step", True, [_line(wr, k) for k in STEP_ATTENTION_KEYS if has(k)]),
        ("Gradients", False, [_line(wr, k, log_y=_log_y(k)) for k in gradients]),
        ("Train-inference gap", True, [
            *(wr.BarPlot(title=f"{k} per cell (final)", metrics=[k], orientation="h")
              for k in (EVAL_GAP, EVAL_BELOW_FLOOR) if has(k)),
            *([_line(wr, EVAL_GAP)] if has(EVAL_GAP) else []),
        ]),
        ("Attention of the probe batch, per layer", False,
         [_by_layer(wr, k, layers) for k in layer_keys(ATTENTION_KEYS)]),
        ("Attention of the training batch, per layer", False,
         [_by_layer(wr, k, layers) for k in layer_keys(STEP_ATTENTION_KEYS)]),
        ("Gradients per layer", False, [
            *(_by_layer(wr, k, layers, log_y=_log_y(k)) for k in layer_keys(GRADIENT_KEYS)),
            *(wr.LinePlot(title=f"{key.replace('{l}', '*')} per layer", x=STEP, log_y=True,
                          y=[key.replace("{l}", str(li)) for li in range(layers)]) for key in grad_parts),
        ]),
        ("Axes -> loss", True, [
            wr.ParallelCoordinatesPlot(title=f"d_k, scale, mask -> {BEST_EVAL_LOSS}", columns=[
                *(wr.ParallelCoordinatesPlotColumn(metric=wr.Config(key), display_name=label)
                  for label, key in AXES.items()),
                wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(BEST_EVAL_LOSS),
                                                 display_name="best held-out loss"),
            ]),
        ]),
    ]
    return [ws.Section(name=name, is_open=is_open, panels=panels) for name, is_open, panels in sections if panels]


def build_workspace(entity: str, project: str, sweep: str, name: str | None = None, layers: int = DEFAULT_LAYERS,
                    logged=None):
    """The workspace object for one sweep (its runs: those whose `sweep_name` config key is `sweep`); `logged` the
    keys the runs logged (None: every key of the registry). Nothing is sent until .save()."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    if logged is None:
        logged = {m.key for m in METRICS if "{" not in m.key}
        logged |= {per_layer(m.key, li) for m in METRICS if m.per_layer for li in range(layers)}
        logged |= {m.key.replace("{l}", str(li)) for m in METRICS if "{l}" in m.key for li in range(layers)}
    return ws.Workspace(
        entity=entity, project=project, name=name or f"sweep {sweep}", sections=sections_for(wr, ws, layers, logged),
        settings=ws.WorkspaceSettings(x_axis=STEP, max_runs=100),
        runset_settings=ws.RunsetSettings(filters=ws.And(ws.Config(SWEEP_KEY) == sweep),
                                          groupby=[ws.Metric("Group")]),
    )


def describe(workspace) -> str:
    """Sections and the keys of each panel, one line each."""
    lines = [f"workspace {workspace.name!r} for {workspace.entity}/{workspace.project}"]
    for section in workspace.sections:
        lines.append(f"  [{section.name}]")
        for panel in section.panels:
            lines.append(f"    {type(panel).__name__}: {panel.title}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m andrea_exp.runs.workspace", description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR", help="the sweep's directory (hydra.sweep.dir)")
    parser.add_argument("--entity", default=None, help="W&B entity (default: the runs' logger.entity)")
    parser.add_argument("--project", default=None, help="W&B project (default: the runs' logger.project)")
    parser.add_argument("--name", default=None, help="workspace name (default: 'sweep <sweep name>')")
    parser.add_argument("--save", action="store_true", help="save it to W&B (needs a login); prints the URL")
    args = parser.parse_args(argv)
    try:
        facts = read_sweep(args.sweep_dir)
    except FileNotFoundError as err:
        print(f"error: SWEEP_DIR: {err}", file=sys.stderr)
        return 2
    entity = args.entity or facts.entity
    if args.save and not entity:
        print("error: --entity is needed to save (the runs' logger.entity is null)", file=sys.stderr)
        return 2
    workspace = build_workspace(entity or "(your entity)", args.project or facts.project, facts.sweep, args.name,
                                facts.layers, facts.logged)
    print(describe(workspace))
    if not args.save:
        print("(not saved: add --save to create it in W&B)")
        return 0
    try:
        workspace.save()
    except Exception as err:
        print(f"error: could not save the workspace: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    print(workspace.url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
