"""The values that model settings may take, and their normalisers, without importing torch.

The settings schema and the validation read these in the process that launches a sweep, which then
never imports torch (seconds of start-up before the first cell); the model and attention modules
import the same names from here. The attention variants' values (scale, mask fill, attn_impl) live in
config/variants.py, re-exported here.
"""

from __future__ import annotations

from andrea_exp.config.variants import (  # noqa: F401  (re-exported: the attention variants' values)
    ATTN_IMPLS,
    BILINEAR_NEEDS_NO_QK_LAYERNORM,
    SCALE_MODES,
    normalize_mask_fill,
    normalize_scale,
)

SDPA_BACKEND_NAMES = ("flash", "cudnn", "efficient", "math")  # `model.sdpa_backend` besides auto
QK_INITS = ("unit", "gpt2", "torch")
LOSS_IMPLS = ("chunked", "plain")


def canonical_scale(scale):
    """`model.scale` as one value however it was typed (true, "sqrt", "on" -> "sqrt"; false, "none" -> "none";
    "inv"), for summaries, tables and names; a value that is no scale mode is left as it is."""
    try:
        return normalize_scale(scale)
    except ValueError:
        return scale


ATTN_STATS_CHOICES = ("every", "off")  # `train.attn_stats`
ATTN_STATS_PASSES = ("auto", "fused", "separate")  # `train.attn_stats_pass`


def resolve_attn_stats_pass(value: str, every: int) -> str:
    """`train.attn_stats_pass` as fused | separate. auto: fused at every step, separate with a cadence: on an H200
    at ANDREA-120M the fused pass costs 1.6% of throughput at every step and, since it replaces the attention's
    forward on all steps, 1.3% at every 10th; the separate pass 3.0% at every step and a tenth of that at every
    10th (benchmarks/results/attn_stats_h200.json)."""
    if value not in ATTN_STATS_PASSES:
        raise ValueError(f"train.attn_stats_pass must be one of {', '.join(ATTN_STATS_PASSES)}; got {value!r}")
    if value == "auto":
        return "fused" if every == 1 else "separate"
    return value


def normalize_attn_stats(value) -> str:
    """`train.attn_stats` as every | off (YAML reads a bare `off` as false and `on` as true)."""
    if isinstance(value, bool):
        return "every" if value else "off"
    if value not in ATTN_STATS_CHOICES:
        raise ValueError(f"train.attn_stats must be one of every, off; got {value!r}")
    return value
