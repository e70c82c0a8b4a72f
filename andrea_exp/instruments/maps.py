"""Attention maps as PNG files: one figure per layer, a few heads side by side.

Uses matplotlib's object API with the Agg canvas, so it never switches the process's pyplot backend.
The margins are fixed rather than computed by a layout engine: constrained layout more than doubled the
time of each figure, and a sweep draws several per cell on the CPU while its GPU waits.
"""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def save_attention_maps(patterns: torch.Tensor, path: Path, title: str) -> Path:
    """patterns: (H, T_q, T_k) probabilities of one sequence. Colour scale fixed to [0, 1] so maps of
    different steps and runs compare directly. Returns the written path."""
    patterns = patterns.detach().float().cpu()
    n_heads = patterns.size(0)
    width = 2.6 * n_heads + 0.8
    fig = Figure(figsize=(width, 2.9), dpi=100)
    FigureCanvasAgg(fig)
    right = 1 - 0.75 / width  # room for the colour bar
    fig.subplots_adjust(left=0.45 / width, right=right - 0.35 / width, bottom=0.16, top=0.82, wspace=0.25)
    axes = fig.subplots(1, n_heads, squeeze=False)[0]
    image = None
    for h, ax in enumerate(axes):
        image = ax.imshow(patterns[h].numpy(), vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest")
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
