"""Attention maps as PNG files: one figure per layer, a few heads side by side.

Uses matplotlib's object API with the Agg canvas, so it never switches the process's pyplot backend.
The margins are fixed rather than computed by a layout engine: constrained layout more than doubled the
time of each figure, and a sweep draws several per cell on the CPU while its GPU waits. No torch here: the
drawing process of a run (instruments/map_worker.py) imports this module alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def save_attention_maps(patterns, path: Path, title: str) -> Path:
    """patterns: (H, T_q, T_k) probabilities of one sequence (a tensor or an array). Colour scale fixed to
    [0, 1] so maps of different steps and runs compare directly. Returns the written path."""
    if hasattr(patterns, "detach"):  # a tensor: float32 on the host, as the arrays a run stores
        patterns = patterns.detach().float().cpu().numpy()
    patterns = np.asarray(patterns, dtype=np.float32)
    n_heads = patterns.shape[0]
    width = 2.6 * n_heads + 0.8
    fig = Figure(figsize=(width, 2.9), dpi=100)
    FigureCanvasAgg(fig)
    right = 1 - 0.75 / width  # room for the colour bar
    fig.subplots_adjust(left=0.45 / width, right=right - 0.35 / width, bottom=0.16, top=0.82, wspace=0.25)
    axes = fig.subplots(1, n_heads, squeeze=False)[0]
    image = None
    for h, ax in enumerate(axes):
        image = ax.imshow(patterns[h], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("key j", fontsize=8)
        if h == 0:
            ax.set_ylabel("query i", fontsize=8)
        ax.tick_params(labelsize=7)
    bar = fig.colorbar(image, cax=fig.add_axes((right - 0.15 / width, 0.2, 0.12 / width, 0.58)), label="probability")
    bar.ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def draw_arrays(arrays: Path, maps: list[tuple[str, str, str]]) -> dict[str, Path]:
    """The PNGs of one .npz of attention patterns: maps are (array name, PNG path, title)."""
    with np.load(arrays) as stored:
        return {name: save_attention_maps(stored[name], Path(png), title) for name, png, title in maps}
