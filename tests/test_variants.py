"""One typed model config (config.schema.ModelSchema, checked on construction) and the attention variants'
registry (config/variants.py) that its rules and the model read."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import compose_config
from omegaconf import OmegaConf

from andrea_exp.config import variants
from andrea_exp.config.schema import SETTINGS, ModelSchema
from andrea_exp.config.validation import ConfigError, validate
from andrea_exp.model.decoder import Andrea, ModelConfig
from andrea_exp.training.cell import build_model

TINY = dict(vocab_size=12, d_model=32, n_layer=1, n_head=2, d_k=8, d_v=8, block_size=16)


def test_the_model_is_built_from_the_schemas_own_dataclass():
    assert ModelConfig is ModelSchema
    cfg = compose_config("model=andrea_tiny")
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
    cfg = compose_config("model=andrea_tiny")
    cfg.model[key] = value
    with pytest.raises(ConfigError, match=f"^{message}"):
        validate(cfg)


def test_the_rules_across_the_variants_settings_are_checked_both_ways():
    with pytest.raises(ConfigError, match=r"^model.attn_impl=bilinear needs model.qk_layernorm=false"):
        ModelSchema(**TINY, attn_impl="bilinear", qk_layernorm=True)
    with pytest.raises(ConfigError, match=r"^model.attn_impl=bilinear needs model.qk_layernorm=false"):
        validate(compose_config("model.attn_impl=bilinear", "model.qk_layernorm=true"))


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


# ---------------------------------------------------------------- a score transform is one registry entry


def softcap(scores, cap):
    return cap * (scores / cap).tanh()


@pytest.fixture
def with_softcap(monkeypatch):
    """A soft-capping variant registered as a new variant would be (its setting set on the instance here,
    where a real one has its line in ModelSchema)."""
    monkeypatch.setitem(variants.SCORE_TRANSFORMS, "softcap_for_test", softcap)

    def spec(cap, **overrides):
        cfg = ModelSchema(**{**TINY, "scale": "none", **overrides})
        cfg.softcap_for_test = cap
        return cfg
    return spec


def test_soft_capping_is_the_one_transform_registered_and_no_preset_turns_it_on():
    assert list(variants.SCORE_TRANSFORMS) == ["logit_softcap"]
    assert variants.score_transforms(ModelSchema(**TINY)) == ()
    for preset in ("andrea_tiny", "andrea_small", "andrea_120m"):
        assert variants.transforms_on(compose_config(f"model={preset}").model) == []


def test_a_transform_is_applied_to_the_scaled_scores_before_the_mask():
    from andrea_exp.model.attention import explicit_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64) * 3 for _ in range(3))
    out, pattern = explicit_attention(q, k, v, scale=0.5, causal=True, transforms=(lambda s: softcap(s, 1.5),))
    scores = softcap(0.5 * q @ k.transpose(-1, -2), 1.5)  # (B, H, T, T), by hand
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
    expected = torch.softmax(scores, -1)
    assert torch.allclose(pattern, expected) and torch.allclose(out, expected @ v)
    assert pattern.triu(1).abs().max() == 0  # a masked entry carries no mass


def test_the_model_takes_a_registered_transform_on_every_explicit_path(with_softcap):
    torch.manual_seed(0)
    x = torch.randint(0, 12, (2, 9))
    capped = Andrea(with_softcap(0.25, qk_init="unit"))
    assert capped.blocks[0].attn.impl == "explicit"  # auto never takes the fused kernels with a transform
    loose = Andrea(with_softcap(1e9, qk_init="unit"))
    loose.load_state_dict(capped.state_dict())
    plain = Andrea(ModelSchema(**{**TINY, "scale": "none", "qk_init": "unit"}))
    plain.load_state_dict(capped.state_dict())
    assert torch.allclose(loose(x)[0], plain(x)[0], atol=1e-5)  # a cap far above the scores changes nothing
    assert not torch.allclose(capped(x)[0], plain(x)[0], atol=1e-3)
    attn = capped.blocks[0].attn
    attn.stages = {}
    capped(x)  # the probe's capture: the explicit path with stages
    assert attn.stages["scores"].masked_fill(torch.isinf(attn.stages["scores"]), 0).abs().max() <= 0.25


def test_a_transform_is_refused_with_the_fused_kernels_and_the_every_step_statistics(with_softcap):
    with pytest.raises(ConfigError, match="model.attn_impl=fused cannot apply softcap_for_test"):
        variants.check_variant(with_softcap(5.0, attn_impl="fused"))
    with pytest.raises(ConfigError, match="train.attn_stats=every reads q and k alone, without softcap_for_test"):
        variants.check_with_training(with_softcap(5.0), "every")
    variants.check_with_training(with_softcap(5.0), "off")
    variants.check_with_training(ModelSchema(**TINY), "every")  # no transform: the statistics are exact
