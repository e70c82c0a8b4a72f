"""The report's figures: matplotlib's object API on the Agg canvas (no display, no global backend switch).

Each function takes plain numbers already gathered by the claims code and writes one PNG.
Series are dicts: label -> list of (x, y, spread) points, spread 0 when there is one seed.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def _figure(n_rows: int = 1, n_cols: int = 1, width: float = 5.5, height: float = 3.8):
    fig = Figure(figsize=(width * n_cols, height * n_rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(n_rows, n_cols, squeeze=False)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def _plot_series(ax, series: dict, *, style=None) -> None:
    for label, points in series.items():
        points = sorted(p for p in points if p[1] is not None and math.isfinite(p[1]))
        if not points:
            continue
        xs, ys, spread = zip(*points)
        kwargs = (style or {}).get(label, {})
        ax.errorbar(xs, ys, yerr=[s if math.isfinite(s) else 0 for s in spread], marker="o", capsize=3,
                    label=label, **kwargs)


def line_panels(path: Path, panels: list[dict], *, n_cols: int = 2) -> Path:
    """Generic grid of panels: each {title, xlabel, ylabel, series, logx, logy, refs: [(label, xs, ys)]}."""
    n_rows = math.ceil(len(panels) / n_cols)
    fig, axes = _figure(n_rows, n_cols)
    flat = [ax for row in axes for ax in row]
    for ax, panel in zip(flat, panels):
        _plot_series(ax, panel.get("series", {}), style=panel.get("style"))
        for label, xs, ys in panel.get("refs", []):
            ax.plot(xs, ys, "k--", lw=1, label=label)
        if panel.get("logx"):
            ax.set_xscale("log", base=2 if panel.get("logx") == 2 else 10)
        if panel.get("logy"):
            ax.set_yscale("log")
        ax.set_title(panel.get("title", ""), fontsize=10)
        ax.set_xlabel(panel.get("xlabel", ""))
        ax.set_ylabel(panel.get("ylabel", ""))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    return _save(fig, path)


def loss_curves(path: Path, curves: dict, *, floor: float | None = None, title: str = "training loss") -> Path:
    """curves: cell label -> (steps, mean loss, std loss). One line per cell, a band for the seed spread."""
    fig, axes = _figure(width=8, height=5)
    ax = axes[0][0]
    for label, (steps, mean, std) in curves.items():
        line = ax.plot(steps, mean, lw=1.2, label=label)[0]
        if any(s > 0 for s in std):
            lo = [m - s for m, s in zip(mean, std)]
            hi = [m + s for m, s in zip(mean, std)]
            ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.2)
    if floor is not None and math.isfinite(floor):
        ax.axhline(floor, color="k", ls="--", lw=1, label=f"entropy floor {floor:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("train/loss (nats)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    return _save(fig, path)


def grouped_bars(path: Path, groups: list[str], bars: dict, *, ylabel: str, title: str,
                 hline: tuple[str, float] | None = None, per_group_marks: dict | None = None) -> Path:
    """bars: bar label -> list of (value, spread) per group; per_group_marks: label -> value per group (dashes)."""
    fig, axes = _figure(width=max(6, 0.9 * len(groups) + 2), height=4.5)
    ax = axes[0][0]
    width = 0.8 / max(len(bars), 1)
    for b, (label, values) in enumerate(bars.items()):
        xs = [g + (b - (len(bars) - 1) / 2) * width for g in range(len(groups))]
        ys = [v if v is not None and math.isfinite(v) else 0.0 for v, _ in values]
        err = [s if s is not None and math.isfinite(s) else 0.0 for _, s in values]
        ax.bar(xs, ys, width=width, yerr=err, capsize=3, label=label)
    for label, values in (per_group_marks or {}).items():
        for g, v in enumerate(values):
            if v is not None and math.isfinite(v):
                ax.hlines(v, g - 0.45, g + 0.45, colors="k", linestyles="--", lw=1,
                          label=label if g == 0 else None)
    if hline is not None:
        ax.axhline(hline[1], color="k", ls=":", lw=1, label=hline[0])
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)
