"""Checks every setting before any expensive work, with one line that names it and what is allowed."""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from andrea_exp.attention import normalize_mask_fill, normalize_scale
from andrea_exp.model import ATTN_IMPLS, QK_INITS

LOGGER_MODES = ("auto", "online", "offline", "disabled")
DATA_SOURCES = ("markov", "text")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")


class ConfigError(ValueError):
    """A bad setting; its message is the one line the user sees."""


def _positive_int(cfg, key: str, minimum: int = 1) -> None:
    value = cfg_get(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}; got {value!r}")


def _finite(cfg, key: str, low: float | None = None, low_inclusive=True, high: float | None = None) -> None:
    value = cfg_get(cfg, key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None:
        ok = value >= low if low_inclusive else value > low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        bounds = []
        if low is not None:
            bounds.append(f"{'>=' if low_inclusive else '>'} {low:g}")
        if high is not None:
            bounds.append(f"<= {high:g}")
        raise ConfigError(f"{key} must be a finite number {' and '.join(bounds)}; got {value!r}".replace("  ", " "))


def _choice(cfg, key: str, allowed) -> None:
    value = cfg_get(cfg, key)
    if value not in allowed:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, allowed))}; got {value!r}")


def cfg_get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError on the first bad setting."""
    for key in ("model.d_model", "model.n_layer", "model.n_head", "model.d_k", "model.d_v", "model.block_size",
                "model.mlp_ratio", "data.seq_len", "train.batch_size", "data.train_sequences", "data.eval_sequences"):
        _positive_int(cfg, key)
    for key in ("train.max_steps", "train.warmup_steps", "train.eval_every", "train.ckpt_every", "probe.every",
                "probe.maps_every", "train.sample_tokens", "seed"):
        _positive_int(cfg, key, minimum=0)
    _positive_int(cfg, "train.log_every")
    _positive_int(cfg, "train.diverge_patience")
    _positive_int(cfg, "probe.batch_size")
    _finite(cfg, "train.lr", low=0, low_inclusive=False)
    _finite(cfg, "train.min_lr_ratio", low=0, high=1)
    _finite(cfg, "train.weight_decay", low=0)
    _finite(cfg, "train.grad_clip", low=0)
    _finite(cfg, "train.diverge_factor", low=1, low_inclusive=False)
    _finite(cfg, "model.dropout", low=0, high=1)
    try:
        normalize_scale(cfg.model.scale)
        normalize_mask_fill(cfg.model.mask_fill)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    _choice(cfg, "model.qk_init", QK_INITS)
    _choice(cfg, "model.attn_impl", ATTN_IMPLS)
    _choice(cfg, "model.causal", (True, False))
    _choice(cfg, "model.qk_layernorm", (True, False))
    _choice(cfg, "train.precision", PRECISIONS)
    _choice(cfg, "train.resume", (True, False))
    _choice(cfg, "train.compile", (True, False))
    _choice(cfg, "logger.mode", LOGGER_MODES)
    _choice(cfg, "data.name", DATA_SOURCES)
    device = str(cfg.train.device)
    if not (device in ("auto", "cpu", "cuda") or device.startswith("cuda:")):
        raise ConfigError(f"train.device must be auto, cpu, cuda or cuda:N; got {device!r}")
    if cfg.data.seq_len > cfg.model.block_size:
        raise ConfigError(f"data.seq_len ({cfg.data.seq_len}) must be <= model.block_size ({cfg.model.block_size})")
    if cfg.data.name == "markov":
        for key in ("data.vocab_size", "data.order", "data.branching"):
            _positive_int(cfg, key)
        _finite(cfg, "data.concentration", low=0, low_inclusive=False)
        if cfg.data.vocab_size ** cfg.data.order > 2_000_000:
            raise ConfigError("data.vocab_size ** data.order must be at most 2,000,000 contexts; "
                              f"got {cfg.data.vocab_size}**{cfg.data.order}")
    else:
        path = None if OmegaConf.is_missing(cfg.data, "path") else cfg.data.get("path")
        if path in (None, "", "???"):
            raise ConfigError("data.path must name a text file when data=text; got nothing")
        file = Path(str(path)).expanduser()
        if not file.is_file():
            raise ConfigError(f"data.path must name an existing text file; {str(file)!r} does not exist")
        if file.stat().st_size < 2 * (cfg.data.seq_len + 2):
            raise ConfigError(f"data.path must hold at least {2 * (cfg.data.seq_len + 2)} bytes for "
                              f"data.seq_len={cfg.data.seq_len}; {str(file)!r} has {file.stat().st_size}")
    vocab = cfg.model.get("vocab_size")
    if vocab is not None:
        _positive_int(cfg, "model.vocab_size")
