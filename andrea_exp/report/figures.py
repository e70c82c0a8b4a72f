"""The report's figures: matplotlib's object API on the Agg canvas (no display, no global backend switch).

Each function takes plain numbers already gathered by the claims code and writes one PNG.
Series are dicts: label -> list of (x, y, spread) points, spread 0 when there is one seed.
Inside `drawn_in_parallel()` each figure is handed to a worker process and its path returned at once:
laying out and rasterising is most of a report's time, and no figure depends on another.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import re
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

_pool: ProcessPoolExecutor | None = None  # set inside drawn_in_parallel(); None in its workers (they draw)
_pending: list[Future] = []


@contextmanager
def drawn_in_parallel(workers: int | None = None):
    """Figures asked for in the block are drawn by up to `workers` processes (default: the CPUs, at most 8);
    every one is on disk when the block ends, and a figure that failed raises there."""
    global _pool
    workers = workers or min(8, os.cpu_count() or 1)
    if workers < 2 or _pool is not None:
        yield
        return
    # spawned, not forked: a fork would copy this module's _pool into the worker and the figures' locks mid-use
    _pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield
        for future in _pending:
            future.result()
    finally:
        pool, _pool = _pool, None
        _pending.clear()
        pool.shutdown(cancel_futures=True)


def _may_be_deferred(draw):
    """Draw now, or, inside drawn_in_parallel(), in a worker (the workers find this same wrapper by name)."""
    @functools.wraps(draw)
    def call(path, *args, **kwargs):
        if _pool is None:
            return draw(path, *args, **kwargs)
        _pending.append(_pool.submit(call, path, *args, **kwargs))
        return Path(path)
    call.drawn_in_worker = True  # its module is imported by each worker: it must stay light (no torch)
    return call


def _figure(n_rows: int = 1, n_cols: int = 1, width: float = 5.5, height: float = 3.8):
    fig = Figure(figsize=(width * n_cols, height * n_rows), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(n_rows, n_cols, squeeze=False)


TICK_LABEL_SIZE = 7  # major and minor tick labels alike (a log axis labels its minor ticks too)


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")  # wide shared legends stay inside the image
    return path


# one colour per setting in every figure of the report and the appendix, so a reader learns them once
SETTING_COLOURS = {"1/sqrt(d_k)": "C0", "no divisor": "C3", "1/d_k": "C2", "1/sqrt(d_k) + QK-LN": "C1",
                   "1/d_k + QK-LN": "C4", "as trained (no mask)": "C0", "causal twin": "C2",
                   "at generation (no mask)": "C3"}
_SCALE_WORDS = {"sqrt": "1/sqrt(d_k)", "none": "no divisor", "inv": "1/d_k"}
_SCALE_AXIS = re.compile(r"(?:^|\s)scale=(sqrt|none|inv)(?=\s|$)")
_QK_LN_ON = re.compile(r"(?:^|\s)qk_layernorm=true(?=\s|$)", re.I)


def setting_of(label: str) -> str | None:
    """The setting a label names, as SETTING_COLOURS spells it: the label itself ("no divisor"), or its
    scale axis ("[grid] scale=none causal=True (n=3)" -> "no divisor", with qk_layernorm=True "... + QK-LN")."""
    if label in SETTING_COLOURS:
        return label
    scale = _SCALE_AXIS.search(label)
    if scale is None:
        return None
    words = _SCALE_WORDS[scale.group(1)] + (" + QK-LN" if _QK_LN_ON.search(label) else "")
    return words if words in SETTING_COLOURS else None


def _colours(labels) -> dict:
    """One colour per label, the same in every panel of a figure (so one legend serves them all): a label that
    alone in the figure names a setting of SETTING_COLOURS gets that setting's colour; the others take the
    cycle's colours that no such label holds."""
    labels = list(dict.fromkeys(labels))
    settings = [setting_of(label) for label in labels]
    colours = {label: SETTING_COLOURS[s] for label, s in zip(labels, settings)
               if s is not None and settings.count(s) == 1}
    cycle = [c for c in ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8", "C9", "olive", "navy", "maroon",
                         "teal") if c not in colours.values()]
    rest = [label for label in labels if label not in colours]
    colours.update({label: cycle[i % len(cycle)] for i, label in enumerate(rest)})
    return colours


def _line_style(label: str) -> str:
    """Dashed for the runs without the divisor, so scaled/unscaled twins read apart at a glance."""
    return "--" if "scale=none" in label else "-"


def _plot_series(ax, series: dict, colours: dict) -> None:
    for label, points in series.items():
        points = sorted(p for p in points if p[1] is not None and math.isfinite(p[1]))
        if not points:
            continue
        xs, ys, spread = zip(*points)
        ax.errorbar(xs, ys, yerr=[s if math.isfinite(s) else 0 for s in spread], marker="o", ms=4, capsize=3,
                    color=colours[label], ls=_line_style(label), label=label)


def _shared_legend(fig, axes) -> None:
    """One legend below all panels: many series in a small panel's own legend would hide the data."""
    handles, labels = {}, []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = handle
                labels.append(label)
    if labels:
        fig.legend([handles[lb] for lb in labels], labels, loc="outside lower center", fontsize=8,
                   ncol=2 if len(labels) > 4 else len(labels), frameon=False)


def _legend_height(n_labels: int) -> float:
    return 0.3 + 0.2 * math.ceil(n_labels / 2) if n_labels > 4 else 0.5


def _style_panel(ax, panel: dict, *, title_size: int, label_size: int | None = None, xlabel: str = "",
                 ylabel: str = "") -> None:
    """A panel's axes as every grid of panels draws them: log axes where asked, its title and labels (the panel's
    own, else these defaults), small tick labels, a light grid."""
    if panel.get("logx"):
        ax.set_xscale("log", base=2 if panel["logx"] == 2 else 10)
    if panel.get("logy"):
        ax.set_yscale("log")
    label_font = {} if label_size is None else {"fontsize": label_size}
    ax.set_title(panel.get("title", ""), fontsize=title_size)
    ax.set_xlabel(panel.get("xlabel", xlabel), **label_font)
    ax.set_ylabel(panel.get("ylabel", ylabel), **label_font)
    ax.tick_params(which="both", labelsize=TICK_LABEL_SIZE)
    ax.grid(alpha=0.3)


def _save_panels(fig, flat: list, n_panels: int, path: Path) -> Path:
    """The grid's unused axes hidden, one legend below its panels, the PNG written."""
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    _shared_legend(fig, flat[:n_panels])
    return _save(fig, path)


@_may_be_deferred
def line_panels(path: Path, panels: list[dict], *, n_cols: int = 2) -> Path:
    """Generic grid of panels: each {title, xlabel, ylabel, series, logx, logy, refs: [(label, xs, ys)]}."""
    n_cols = min(n_cols, len(panels))
    n_rows = math.ceil(len(panels) / n_cols)
    labels = [label for panel in panels for label in panel.get("series", {})]
    refs = {label for panel in panels for label, _, _ in panel.get("refs", [])}
    colours = _colours(labels)
    fig, axes = _figure(n_rows, n_cols, height=3.6)
    fig.set_figheight(3.6 * n_rows + _legend_height(len(set(labels) | refs)))
    flat = [ax for row in axes for ax in row]
    for ax, panel in zip(flat, panels):
        _plot_series(ax, panel.get("series", {}), colours)
        for label, xs, ys in panel.get("refs", []):
            ax.plot(xs, ys, color="k", ls=":", lw=1, label=label)
        _style_panel(ax, panel, title_size=10)
    return _save_panels(fig, flat, len(panels), path)


@_may_be_deferred
def loss_curve_panels(path: Path, panels: list[dict], *, title: str, n_cols: int = 3) -> Path:
    """panels: each {title, curves: label -> (steps, mean, std), floor}. Mean line and a one-std band per curve."""
    n_cols = min(n_cols, len(panels))
    n_rows = math.ceil(len(panels) / n_cols)
    labels = [label for panel in panels for label in panel["curves"]]
    colours = _colours(labels)
    fig, axes = _figure(n_rows, n_cols, width=4.8, height=3.6)
    fig.set_figheight(3.6 * n_rows + _legend_height(len(set(labels)) + 1))
    flat = [ax for row in axes for ax in row]
    for ax, panel in zip(flat, panels):
        for label, (steps, mean, std) in panel["curves"].items():
            ax.plot(steps, mean, lw=1.2, color=colours[label], ls=_line_style(label), label=label)
            if any(s > 0 for s in std):
                ax.fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                                color=colours[label], alpha=0.2)
        floor = panel.get("floor")
        if floor is not None and math.isfinite(floor):
            ax.axhline(floor, color="k", ls=":", lw=1, label="entropy floor")
        _style_panel(ax, {"title": panel["title"]}, title_size=10, xlabel="step", ylabel="train/loss (nats)")
    fig.suptitle(title, fontsize=11)
    return _save_panels(fig, flat, len(panels), path)


@_may_be_deferred
def grouped_bars(path: Path, groups: list[str], bars: dict, *, ylabel: str, title: str,
                 per_group_marks: dict | None = None) -> Path:
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
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


REF_STYLES = {"floor": ":", "bigram": "--", "unigram": "-."}  # reference levels' line styles


@_may_be_deferred
def curve_panels(path: Path, panels: list[dict], *, n_cols: int = 3) -> Path:
    """panels: each {title, ylabel, xlabel, curves: label -> [(x, mean, std)], refs: {name: y}, logx, logy, marks:
    label -> (x, y)}. Mean line, a one-std band, dotted reference levels."""
    n_cols = min(n_cols, len(panels))
    n_rows = math.ceil(len(panels) / n_cols)
    labels = [label for panel in panels for label in panel["curves"]]
    colours = _colours(labels)  # a setting's colour, the same in the appendix's figures
    fig, axes = _figure(n_rows, n_cols, width=4.6, height=3.4)
    fig.set_figheight(3.4 * n_rows + 0.6)
    flat = [ax for row in axes for ax in row]
    for ax, panel in zip(flat, panels):
        for label, points in panel["curves"].items():
            points = sorted(p for p in points if p[1] is not None and math.isfinite(p[1]))
            if not points:
                continue
            xs, ys, sd = zip(*points)
            ax.plot(xs, ys, lw=1.4, color=colours[label], label=label, marker="o" if len(xs) < 12 else None, ms=4)
            if any(s and math.isfinite(s) and s > 0 for s in sd):
                ax.fill_between(xs, [y - (s or 0) for y, s in zip(ys, sd)], [y + (s or 0) for y, s in zip(ys, sd)],
                                color=colours[label], alpha=0.18)
        for label, (x, y) in panel.get("marks", {}).items():
            ax.plot([x], [y], marker="*", ms=12, color=colours.get(label, "k"), ls="none")
        for name, y in panel.get("refs", {}).items():
            ax.axhline(y, color="0.35", ls=REF_STYLES.get(name, ":"), lw=1, label=name)
        _style_panel(ax, panel, title_size=9, label_size=8, xlabel="step")
    return _save_panels(fig, flat, len(panels), path)
