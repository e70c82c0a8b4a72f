"""A W&B workspace for one sweep: loss by d_k / scale / mask, attention peakiness (the probe's, and the training
batch's at every step where train.attn_stats is on, per layer), the train-inference gap.

    python -m andrea_exp.runs.workspace --entity E --project P --group G [--save]

Without --save it prints what it would build (no login needed). The group is the sweep's W&B group:
the sweep directory's last two parts joined by "-" (e.g. claims_grid-2026-05-01_12-00-00), or logger.group.
"""

from __future__ import annotations

import argparse
import sys

from andrea_exp.runs.metric_keys import (
    ATTN_STEP,
    EVAL_BELOW_FLOOR,
    EVAL_FLOOR,
    EVAL_GAP,
    EVAL_LOSS_AS_TRAINED,
    EVAL_LOSS_GENERATION,
    METRICS,
    TRAIN_LOSS,
    TRAIN_STEP,
    per_layer,
)

AXES = {"d_k": "model.d_k", "scale": "model.scale", "mask": "model.causal"}
STEP = TRAIN_STEP  # every chart shares the training step (tracking.py defines it as the step metric)
TARGET = EVAL_LOSS_AS_TRAINED
LINEAR_SUFFIXES = ("_frac", "_share")  # shares of rows: 0 is a real value, which a log axis would hide


def pooled_keys(namespace: str) -> tuple[str, ...]:
    """The registry's keys of one namespace pooled over layers (`attn/entropy`, not `grad/L{l}/q`), in its order."""
    return tuple(m.key for m in METRICS if m.key.startswith(namespace + "/") and "{" not in m.key)


ATTENTION_KEYS = pooled_keys("attn")
GRADIENT_KEYS = pooled_keys("grad")
STEP_ATTENTION_KEYS = pooled_keys(ATTN_STEP)  # train.attn_stats: the training batch, every step
DEFAULT_LAYERS = 12  # lines per chart of per-layer keys (a run with fewer layers leaves the rest empty)


def _line(wr, key: str, *, groupby: str | None = None, title: str | None = None, log_y: bool = False):
    """A line chart of one key over the training step; grouped (mean, min-max band) by a config key if given."""
    extra = {"groupby": wr.Config(groupby), "groupby_aggfunc": "mean", "groupby_rangefunc": "minmax"} if groupby else {}
    return wr.LinePlot(title=title or key, x=STEP, y=[key], log_y=log_y or None, **extra)


def step_attention_panels(wr, layers: int) -> list:
    """train.attn_stats: each pooled attn_step/* key, then one chart per statistic with a line per layer."""
    pooled = [_line(wr, key) for key in STEP_ATTENTION_KEYS]
    by_layer = [wr.LinePlot(title=f"{key} per layer", x=STEP, y=[per_layer(key, li) for li in range(layers)])
                for key in STEP_ATTENTION_KEYS]
    return pooled + by_layer


def build_workspace(entity: str, project: str, group: str, name: str | None = None, layers: int = DEFAULT_LAYERS):
    """The workspace object for one sweep; nothing is sent until .save()."""
    import wandb_workspaces.reports.v2 as wr
    import wandb_workspaces.workspaces as ws

    loss_grouped = [_line(wr, TRAIN_LOSS, groupby=key, title=f"{TRAIN_LOSS} by {label}")
                    for label, key in AXES.items()]
    loss_grouped += [_line(wr, TARGET, groupby=key, title=f"{TARGET} by {label}") for label, key in AXES.items()]
    sections = [
        ws.Section(name="Loss by d_k, scale and mask", panels=loss_grouped, is_open=True),
        ws.Section(name="Loss per cell", is_open=True, panels=[
            _line(wr, TRAIN_LOSS), _line(wr, TARGET), _line(wr, EVAL_LOSS_GENERATION), _line(wr, EVAL_FLOOR),
        ]),
        ws.Section(name="Attention over steps", is_open=True,
                   panels=[_line(wr, key) for key in ATTENTION_KEYS]),
        ws.Section(name="Attention of the training batch, every step", is_open=True,
                   panels=step_attention_panels(wr, layers)),
        ws.Section(name="Gradients", is_open=False, panels=[_line(wr, key, log_y=not key.endswith(LINEAR_SUFFIXES))
                                                                for key in GRADIENT_KEYS]),
        ws.Section(name="Train-inference gap", is_open=True, panels=[
            wr.BarPlot(title=f"{EVAL_GAP} per cell (final)", metrics=[EVAL_GAP], orientation="h"),
            wr.BarPlot(title=f"{EVAL_BELOW_FLOOR} per cell (final)", metrics=[EVAL_BELOW_FLOOR], orientation="h"),
            _line(wr, EVAL_GAP),
        ]),
        ws.Section(name="Axes -> loss", is_open=True, panels=[
            wr.ParallelCoordinatesPlot(title=f"d_k, scale, mask -> {TARGET}", columns=[
                *(wr.ParallelCoordinatesPlotColumn(metric=wr.Config(key), display_name=label)
                  for label, key in AXES.items()),
                wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(TARGET), display_name="loss as trained"),
            ]),
        ]),
    ]
    return ws.Workspace(
        entity=entity, project=project, name=name or f"sweep {group}", sections=sections,
        settings=ws.WorkspaceSettings(x_axis=STEP, max_runs=100),
        runset_settings=ws.RunsetSettings(filters=ws.And(ws.Metric("Group") == group)),
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
    parser.add_argument("--entity", required=True, help="W&B entity (user or team)")
    parser.add_argument("--project", required=True, help="W&B project (logger.project)")
    parser.add_argument("--group", required=True, help="the sweep's W&B group")
    parser.add_argument("--name", default=None, help="workspace name (default: 'sweep GROUP')")
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS,
                        help=f"layers drawn in the per-layer attn_step charts (default {DEFAULT_LAYERS})")
    parser.add_argument("--save", action="store_true", help="save it to W&B (needs a login); prints the URL")
    args = parser.parse_args(argv)
    workspace = build_workspace(args.entity, args.project, args.group, args.name, args.layers)
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
