"""The settings' schema: one source of truth for every config group (placeholder interface).

`is_scientific(dotted_key)` says whether a setting can change what a run measures; the report groups
runs by the scientific settings alone.
"""

from __future__ import annotations

_OPERATIONAL = (
    "seed", "name", "cells_per_gpu", "hydra.", "launcher.", "logger.",
    "train.progress", "train.device", "train.compile", "train.eval_every", "train.log_every", "train.ckpt_every",
    "train.resume", "train.sample_tokens",
    "probe.every", "probe.maps_every", "probe.batch_size", "probe.maps_heads", "probe.per_head",
)


def is_scientific(dotted_key: str) -> bool:
    """False for the replicate (seed), naming, launcher, logging, cadence and device settings."""
    return not any(dotted_key == k or (k.endswith(".") and dotted_key.startswith(k)) for k in _OPERATIONAL)
