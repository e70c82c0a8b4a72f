"""The attention variants, in one place: how q.k is scaled, how the future is masked, whether q and k pass a
LayerNorm, and which path (fused kernels, explicit, bilinear) a variant may take.

Free of torch: the schema's rules read the allowed values here (a sweep's launcher never imports torch), and
model.attention / model.decoder compute with the same entries. A new variant (e.g. logit soft-capping) is an
entry here, its setting's line in config/schema.py's ModelSchema, and its test: a transform of the scaled
scores goes into SCORE_TRANSFORMS, and the model, the probe's stages and the path rules below take it up.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from andrea_exp.config.errors import ConfigError

# `model.scale`: the multiplier applied to q.k, by name
SCALES = {
    "sqrt": lambda d_k: 1.0 / math.sqrt(d_k),  # 1/sqrt(d_k): the transformer's
    "none": lambda d_k: 1.0,
    "inv": lambda d_k: 1.0 / d_k,  # 1/d_k (muP)
}
SCALE_MODES = tuple(SCALES)
_SCALE_ALIASES = {"true": "sqrt", "on": "sqrt", "false": "none", "off": "none"}

# `model.mask_fill`: what the future's scores become before the softmax (the fused kernels take -inf only)
FUSED_MASK_FILL = -math.inf
MASK_FILL_MAX = -1e4  # a finite fill must be at least this negative

# Transforms of the scaled scores before the mask, each keyed by the ModelSchema field that sets it: on when
# that field is set (not null, not 0), applied in key order as f(scores, value). Written with tensor methods,
# so this module stays free of torch. The fused kernels cannot apply them (a model with one trains on the
# explicit or bilinear path), nor can the every-step statistics pass (it reads q and k alone).
SCORE_TRANSFORMS: dict[str, Callable] = {
    # `model.logit_softcap`: soft-capping (Gemma 2, Grok): cap * tanh(s / cap), about s for |s| << cap, never
    # beyond +-cap, so no attention logit can grow past it
    "logit_softcap": lambda s, cap: cap * (s / cap).tanh(),
}
FUSED_TAKES_NO_TRANSFORM = "model.attn_impl=fused cannot apply {names} to the scores; use auto, explicit or bilinear"
STATS_SEE_NO_TRANSFORM = ("train.attn_stats=every reads q and k alone, without {names} on the scores; "
                          "use train.attn_stats=off with it")

# `model.qk_layernorm`: a LayerNorm over each head's q and k (before the scale); a flag
QK_LAYERNORM = (True, False)
# `model.qk_init`: how W_q and W_k start
QK_INITS = ("unit", "gpt2", "torch")
# `model.sigma_reparam`: W_q and W_k as gamma / sigma(W) * W (model.sigma_reparam, Zhai et al. 2023); a flag. It
# acts on the weights, not the scores, so every path takes it: the fused kernels, the bilinear form and the
# every-step statistics pass read the reparametrised weights' q and k.

# `model.attn_impl`: how the same formula is computed
ATTN_IMPLS = ("auto", "explicit", "fused", "bilinear")
# Flash and cuDNN kernels stop at this head dim; above it SDPA falls back to slow kernels and the
# explicit path (two GEMMs and a float32 softmax) is several times faster.
SDPA_MAX_HEAD_DIM = 256
SDPA_BACKEND_NAMES = ("flash", "cudnn", "efficient", "math")  # `model.sdpa_backend` besides auto
BILINEAR_NEEDS_NO_QK_LAYERNORM = ("model.attn_impl=bilinear needs model.qk_layernorm=false (the LayerNorm acts on q "
                                  "and k, which the bilinear form never forms); use auto, explicit or fused")


def normalize_scale(scale) -> str:
    """Map a user's `model.scale` to one of SCALE_MODES (true -> sqrt, false -> none)."""
    if isinstance(scale, bool):
        return "sqrt" if scale else "none"
    if isinstance(scale, str):
        lowered = scale.strip().lower()
        lowered = _SCALE_ALIASES.get(lowered, lowered)
        if lowered in SCALES:
            return lowered
    raise ValueError(f"model.scale must be one of {', '.join(SCALE_MODES)}, true, false; got {scale!r}")


def canonical_scale(scale):
    """`model.scale` as one value however it was typed (true, "sqrt", "on" -> "sqrt"; false, "none" -> "none";
    "inv"), for summaries, tables and names; a value that is no scale mode is left as it is."""
    try:
        return normalize_scale(scale)
    except ValueError:
        return scale


def scale_factor(scale, d_k: int) -> float:
    """The multiplier applied to q.k: 1/sqrt(d_k), 1, or 1/d_k."""
    return SCALES[normalize_scale(scale)](d_k)


def normalize_mask_fill(mask_fill) -> float:
    """`model.mask_fill` as a float: -inf, or a large negative number such as -1e9."""
    try:
        value = float(mask_fill)
    except (TypeError, ValueError):
        value = math.nan
    if value == -math.inf or (math.isfinite(value) and value <= MASK_FILL_MAX):
        return value
    raise ValueError(f"model.mask_fill must be -inf or a finite number <= -1e4 (e.g. -1e9); got {mask_fill!r}")


def prefer_fused(d_k: int, d_v: int, mask_fill: float) -> bool:
    """Which path trains faster: fused kernels up to head dim 256, the explicit path above it.

    The fused kernels mask with -inf only, so a finite mask_fill always takes the explicit path.
    """
    return max(d_k, d_v) <= SDPA_MAX_HEAD_DIM and mask_fill == FUSED_MASK_FILL


def transforms_on(model) -> list[str]:
    """The SCORE_TRANSFORMS a ModelSchema (or its composed node) turns on, in application order."""
    return [name for name in SCORE_TRANSFORMS if getattr(model, name, None)]


def score_transforms(model) -> tuple[Callable, ...]:
    """The model's score transforms as functions of the scores alone, bound to its settings."""
    bound = []
    for name in transforms_on(model):
        fn, value = SCORE_TRANSFORMS[name], getattr(model, name)
        bound.append(lambda scores, fn=fn, value=value: fn(scores, value))
    return tuple(bound)


def check_variant(model) -> None:
    """The rules across model settings, for a ModelSchema or its composed node: ConfigError on a bad pair."""
    if model.attn_impl == "bilinear" and model.qk_layernorm:
        raise ConfigError(BILINEAR_NEEDS_NO_QK_LAYERNORM)
    if model.attn_impl == "fused" and transforms_on(model):
        raise ConfigError(FUSED_TAKES_NO_TRANSFORM.format(names=", ".join(transforms_on(model))))


def check_with_training(model, attn_stats: str) -> None:
    """The variant against the training's own readers of attention: the every-step statistics pass."""
    if attn_stats == "every" and transforms_on(model):
        raise ConfigError(STATS_SEE_NO_TRANSFORM.format(names=", ".join(transforms_on(model))))


def resolve_attn_impl(model) -> str:
    """`model.attn_impl` resolved: auto takes the fused kernels up to head dim 256 (with the -inf fill and no
    score transform), the bilinear form when d_k exceeds d_model (and no QK-LayerNorm needs q and k
    themselves), the explicit path otherwise."""
    if model.attn_impl != "auto":
        return model.attn_impl
    if prefer_fused(model.d_k, model.d_v, normalize_mask_fill(model.mask_fill)) and not transforms_on(model):
        return "fused"
    return "bilinear" if model.d_k > model.d_model and not model.qk_layernorm else "explicit"
