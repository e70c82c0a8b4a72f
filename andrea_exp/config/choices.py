"""The values that model settings may take, and their normalisers, without importing torch.

The settings schema and the validation read these in the process that launches a sweep, which then
never imports torch (seconds of start-up before the first cell); the model and attention modules
import the same names from here.
"""

from __future__ import annotations

import math

SCALE_MODES = ("sqrt", "none", "inv")
SDPA_BACKEND_NAMES = ("flash", "cudnn", "efficient", "math")  # `model.sdpa_backend` besides auto
QK_INITS = ("unit", "gpt2", "torch")
ATTN_IMPLS = ("auto", "explicit", "fused", "bilinear")
LOSS_IMPLS = ("chunked", "plain")
BILINEAR_NEEDS_NO_QK_LAYERNORM = ("model.attn_impl=bilinear needs model.qk_layernorm=false (the LayerNorm acts on q "
                                  "and k, which the bilinear form never forms); use auto, explicit or fused")


def normalize_scale(scale) -> str:
    """Map a user's `model.scale` to one of SCALE_MODES (true -> sqrt, false -> none)."""
    if isinstance(scale, bool):
        return "sqrt" if scale else "none"
    if isinstance(scale, str):
        lowered = scale.strip().lower()
        aliases = {"true": "sqrt", "on": "sqrt", "false": "none", "off": "none"}
        lowered = aliases.get(lowered, lowered)
        if lowered in SCALE_MODES:
            return lowered
    raise ValueError(f"model.scale must be one of sqrt, none, inv, true, false; got {scale!r}")


def canonical_scale(scale):
    """`model.scale` as one value however it was typed (true, "sqrt", "on" -> "sqrt"; false, "none" -> "none";
    "inv"), for summaries, tables and names; a value that is no scale mode is left as it is."""
    try:
        return normalize_scale(scale)
    except ValueError:
        return scale


def normalize_mask_fill(mask_fill) -> float:
    """`model.mask_fill` as a float: -inf, or a large negative number such as -1e9."""
    try:
        value = float(mask_fill)
    except (TypeError, ValueError):
        value = math.nan
    if value == -math.inf or (math.isfinite(value) and value <= -1e4):
        return value
    raise ValueError(f"model.mask_fill must be -inf or a finite number <= -1e4 (e.g. -1e9); got {mask_fill!r}")


ATTN_STATS_CHOICES = ("every", "off")  # `train.attn_stats`


def normalize_attn_stats(value) -> str:
    """`train.attn_stats` as every | off (YAML reads a bare `off` as false and `on` as true)."""
    if isinstance(value, bool):
        return "every" if value else "off"
    if value not in ATTN_STATS_CHOICES:
        raise ValueError(f"train.attn_stats must be one of every, off; got {value!r}")
    return value
