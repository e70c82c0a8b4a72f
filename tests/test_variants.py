"""One typed model config (config.schema.ModelSchema, checked on construction) and the attention variants'
registry (config/variants.py) that its rules and the model read."""

from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from andrea_exp.config import variants
from andrea_exp.config.schema import CONF_DIR, SETTINGS, ModelSchema
from andrea_exp.config.validation import ConfigError, validate
from andrea_exp.model.decoder import Andrea, ModelConfig
from andrea_exp.training.loop import build_model

TINY = dict(vocab_size=12, d_model=32, n_layer=1, n_head=2, d_k=8, d_v=8, block_size=16)


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_the_model_is_built_from_the_schemas_own_dataclass():
    assert ModelConfig is ModelSchema
    cfg = composed("model=andrea_tiny")
    assert OmegaConf.get_type(cfg.model) is ModelSchema
    model = build_model(cfg, vocab_size=32)
    assert type(model.cfg) is ModelSchema and model.cfg.vocab_size == 32 and model.cfg.d_k == cfg.model.d_k
    plain = build_model(OmegaConf.create({"model": OmegaConf.to_container(cfg.model)}), vocab_size=32)
    assert plain.cfg == model.cfg and plain.num_params() == model.num_params()


def test_model_settings_have_defaults_and_tie_embeddings_stays_off_the_config():
    spec = ModelSchema(**TINY)
    assert (spec.scale, spec.mask_fill, spec.attn_impl, spec.loss_chunk_rows) == ("sqrt", "-inf", "auto", 4096)
    assert spec.tie_embeddings and not ModelSchema(**TINY, tie_embeddings=False).tie_embeddings
    assert "model.tie_embeddings" not in SETTINGS
    # a preset leaving a setting out gets the schema's default
    merged = OmegaConf.merge(OmegaConf.structured(ModelSchema), {"name": "partial", "d_k": 4})
    assert merged.dropout == 0.0 and merged.d_k == 4 and not OmegaConf.is_missing(merged, "qk_init")


# each model rule: refused by ModelSchema(...) (a direct caller) and by validate() with the same line
BAD = [("d_k", 0, "model.d_k must be an integer >= 1"),
       ("scale", "maybe", "model.scale must be one of sqrt, none, inv, true, false"),
       ("mask_fill", 0, "model.mask_fill must be -inf or a finite number <= -1e4"),
       ("qk_init", "xavier", "model.qk_init must be one of unit, gpt2, torch"),
       ("attn_impl", "sdpa", "model.attn_impl must be one of auto, explicit, fused, bilinear"),
       ("loss_impl", "fast", "model.loss_impl must be one of chunked, plain"),
       ("loss_chunk_rows", 0, "model.loss_chunk_rows must be an integer >= 1"),
       ("dropout", 2.0, "model.dropout must be a finite number >= 0 and <= 1")]


@pytest.mark.parametrize("key,value,message", BAD)
def test_every_model_rule_is_refused_on_construction_and_by_validate(key, value, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        ModelSchema(**{**TINY, key: value})
    cfg = composed("model=andrea_tiny")
    cfg.model[key] = value
    with pytest.raises(ConfigError, match=f"^{message}"):
        validate(cfg)


def test_the_rules_across_the_variants_settings_are_checked_both_ways():
    with pytest.raises(ConfigError, match=r"^model.attn_impl=bilinear needs model.qk_layernorm=false"):
        ModelSchema(**TINY, attn_impl="bilinear", qk_layernorm=True)
    with pytest.raises(ConfigError, match=r"^model.attn_impl=bilinear needs model.qk_layernorm=false"):
        validate(composed("model.attn_impl=bilinear", "model.qk_layernorm=true"))


def test_the_schema_and_the_model_read_the_registry():
    rules = {key: SETTINGS[f"model.{key}"].metadata["rule"] for key in ("scale", "attn_impl", "qk_layernorm")}
    assert rules["attn_impl"].allowed == variants.ATTN_IMPLS and rules["qk_layernorm"].allowed == variants.QK_LAYERNORM
    for mode, factor in variants.SCALES.items():
        rules["scale"].check("model.scale", mode)
        model = Andrea(ModelSchema(**TINY, scale=mode))
        assert model.blocks[0].attn.scale == factor(8)
    assert variants.scale_factor(True, 16) == 0.25 and variants.scale_factor("inv", 16) == 1 / 16
    # the fused path: head dims up to 256 and the -inf fill only; auto falls back to explicit or bilinear
    assert variants.resolve_attn_impl(ModelSchema(**TINY)) == "fused"
    assert variants.resolve_attn_impl(ModelSchema(**TINY, mask_fill=-1e9)) == "explicit"
    assert variants.resolve_attn_impl(ModelSchema(**{**TINY, "d_k": 512})) == "bilinear"
    assert variants.resolve_attn_impl(ModelSchema(**{**TINY, "d_k": 512}, qk_layernorm=True)) == "explicit"
    assert variants.normalize_mask_fill("-inf") == -math.inf
