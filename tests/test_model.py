"""The ANDREA decoder: shapes, initialisation, the 120M preset and causality."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import compose_config

from andrea_exp.model.decoder import Andrea, ModelConfig
from andrea_exp.training.cell import build_model


def small_cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=32, block_size=32, d_model=64, n_layer=2, n_head=4, d_k=16, d_v=16)
    return ModelConfig(**{**base, **overrides})


def shapes(model) -> dict:
    return {name: tuple(p.shape) for name, p in model.state_dict().items()}


def test_d_k_changes_only_query_and_key_weights():
    reference = shapes(Andrea(small_cfg(d_k=16)))
    for d_k in (1, 8, 64, 256, 4096):
        got = shapes(Andrea(small_cfg(d_k=d_k)))
        assert got.keys() == reference.keys()
        changed = {name for name in got if got[name] != reference[name]}
        assert changed == {f"blocks.{i}.attn.{w}.weight" for i in range(2) for w in ("q", "k")}, d_k
        for name in changed:
            assert got[name] == (4 * d_k, 64)  # (n_head * d_k, d_model)


def test_d_k_with_qk_layernorm_changes_only_query_key_parts():
    reference = shapes(Andrea(small_cfg(d_k=16, qk_layernorm=True)))
    got = shapes(Andrea(small_cfg(d_k=128, qk_layernorm=True)))
    changed = {name for name in got if got[name] != reference[name]}
    expected = {f"blocks.{i}.attn.{w}" for i in range(2)
                for w in ("q.weight", "k.weight", "q_norm.weight", "q_norm.bias", "k_norm.weight", "k_norm.bias")}
    assert changed == expected
    assert got["blocks.0.attn.q_norm.weight"] == (128,)


def test_d_v_changes_only_value_and_output_weights():
    reference = shapes(Andrea(small_cfg(d_v=16)))
    got = shapes(Andrea(small_cfg(d_v=40)))
    changed = {name for name in got if got[name] != reference[name]}
    assert changed == {f"blocks.{i}.attn.{w}.weight" for i in range(2) for w in ("v", "o")}
    assert got["blocks.0.attn.v.weight"] == (4 * 40, 64)
    assert got["blocks.0.attn.o.weight"] == (64, 4 * 40)


def layernormed_inputs(n: int, d_model: int) -> torch.Tensor:
    """What a block's attention sees at init: LayerNorm output with weight 1, bias 0."""
    x = torch.randn(n, d_model, generator=torch.Generator().manual_seed(0)) * 3 + 1
    return F.layer_norm(x, (d_model,))  # (n, d_model), each row mean 0, variance 1


@pytest.mark.parametrize("d_model,d_k", [(64, 16), (256, 64), (768, 64), (256, 1024)])
def test_qk_init_unit_gives_unit_variance_components(d_model, d_k):
    torch.manual_seed(0)
    model = Andrea(small_cfg(d_model=d_model, d_k=d_k, n_head=2, qk_init="unit"))
    x = layernormed_inputs(2048, d_model)
    for block in model.blocks:
        for lin in (block.attn.q, block.attn.k):
            comp = lin(x)  # (n, n_head * d_k)
            # std over ~2048 x 2*d_k samples of a variable with std 1: sampling error well under 5%
            assert comp.std().item() == pytest.approx(1.0, abs=0.05)
            assert lin.weight.std().item() == pytest.approx(1 / math.sqrt(d_model), rel=0.05)
    # the premise of claim C2: unscaled q.k has std ~sqrt(d_k)
    q = model.blocks[0].attn.q(x)[:, :d_k]
    k = model.blocks[0].attn.k(x)[:, :d_k]
    dots = (q * k).sum(-1)
    assert dots.std().item() == pytest.approx(math.sqrt(d_k), rel=0.15)


def test_qk_init_gpt2_and_torch():
    torch.manual_seed(0)
    d_model, n_layer = 256, 3
    gpt2 = Andrea(small_cfg(d_model=d_model, d_k=64, n_layer=n_layer, qk_init="gpt2"))
    for lin in (gpt2.blocks[0].attn.q, gpt2.blocks[0].attn.k):
        assert lin.weight.std().item() == pytest.approx(0.02, rel=0.05)
    # the rest of GPT-2's init, whatever qk_init says
    for model in (gpt2, Andrea(small_cfg(d_model=d_model, d_k=64, n_layer=n_layer, qk_init="unit"))):
        assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert model.blocks[0].attn.v.weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert model.blocks[0].mlp.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
        residual = 0.02 / math.sqrt(2 * n_layer)
        assert model.blocks[0].attn.o.weight.std().item() == pytest.approx(residual, rel=0.05)
        assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(residual, rel=0.05)
        assert torch.all(model.blocks[0].mlp.fc.bias == 0)
        assert model.head.weight is model.tok_emb.weight  # tied
    # PyTorch's Linear default: uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), std 1/sqrt(3 fan_in)
    torch_init = Andrea(small_cfg(d_model=d_model, d_k=64, qk_init="torch"))
    w = torch_init.blocks[0].attn.q.weight
    assert w.std().item() == pytest.approx(1 / math.sqrt(3 * d_model), rel=0.05)
    assert w.abs().max().item() <= 1 / math.sqrt(d_model)


def test_bad_qk_init_names_the_setting():
    with pytest.raises(ValueError, match=r"model\.qk_init must be one of unit, gpt2, torch; got 'xavier'"):
        Andrea(small_cfg(qk_init="xavier"))


def test_qk_layernorm_normalises_each_head_vector():
    torch.manual_seed(0)
    model = Andrea(small_cfg(qk_layernorm=True, d_k=32)).eval()
    idx = torch.randint(0, 32, (2, 10))
    captured = model.set_capture(True)
    model(idx)
    for stages in captured:
        for name in ("q", "k"):
            t = stages[name]  # (B, H, T, d_k)
            assert t.shape == (2, 4, 10, 32)
            torch.testing.assert_close(t.mean(-1), torch.zeros(2, 4, 10), atol=1e-5, rtol=0)
            torch.testing.assert_close(t.var(-1, unbiased=False), torch.ones(2, 4, 10), atol=1e-3, rtol=0)
    model.set_capture(False)
    plain = Andrea(small_cfg(qk_layernorm=False))
    assert isinstance(plain.blocks[0].attn.q_norm, torch.nn.Identity)


def gpt2_124m_param_count(V=50304, T=1024, d=768, L=12) -> int:
    """Counted by hand: tied embeddings, bias-free attention projections, MLP with biases, LayerNorms."""
    embeddings = V * d + T * d
    attention = 4 * d * d  # q, k, v, o with d_k = d_v = d / n_head
    mlp = d * 4 * d + 4 * d + 4 * d * d + d
    norms = 2 * 2 * d
    return embeddings + L * (attention + mlp + norms) + 2 * d  # + final LayerNorm


def test_andrea_120m_preset_on_meta_device():
    cfg = compose_config("model=andrea_120m", "model.vocab_size=50304", "data.seq_len=1024")
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.n_head, cfg.model.d_k, cfg.model.d_v) == (
        768, 12, 12, 64, 64)
    with torch.device("meta"):
        model = build_model(cfg, vocab_size=32)  # model.vocab_size wins over the data's
    assert model.cfg.vocab_size == 50304
    n = model.num_params()
    assert n == gpt2_124m_param_count() == 124_439_040
    heads_out = []
    model.blocks[0].attn.o.register_forward_pre_hook(lambda mod, args: heads_out.append(args[0].shape))
    idx = torch.zeros(2, 1024, dtype=torch.long, device="meta")
    logits, _ = model(idx)
    assert heads_out == [torch.Size([2, 1024, 768])]  # (B, T, n_head * d_v): the heads concatenated
    assert logits.shape == (2, 1024, 50304)


def test_andrea_120m_with_qk_layernorm_adds_only_norm_parameters():
    cfg = compose_config("model=andrea_120m", "model.vocab_size=50304", "model.qk_layernorm=true")
    with torch.device("meta"):
        model = build_model(cfg, vocab_size=50304)
    assert model.num_params() == 124_439_040 + 12 * 2 * 2 * 64  # q_norm and k_norm: weight and bias of d_k


def perturbed_logits(model, j: int, **kwargs):
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, model.cfg.vocab_size, (2, 12), generator=gen)
    other = idx.clone()
    other[:, j] = (idx[:, j] + 1) % model.cfg.vocab_size
    with torch.no_grad():
        a, _ = model(idx, **kwargs)
        b, _ = model(other, **kwargs)
    return (a - b).abs().amax(dim=(0, 2))  # (T,): the largest change at each position


@pytest.mark.parametrize("attn_impl", ["explicit", "fused"])
def test_causal_model_changes_only_later_positions(attn_impl):
    torch.manual_seed(0)
    model = Andrea(small_cfg(causal=True, attn_impl=attn_impl)).eval()
    for j in (0, 5, 11):
        change = perturbed_logits(model, j)
        assert torch.all(change[:j] == 0), (j, change)
        assert torch.all(change[j:] > 1e-6), (j, change)


@pytest.mark.parametrize("attn_impl", ["explicit", "fused"])
def test_non_causal_model_changes_earlier_positions(attn_impl):
    torch.manual_seed(0)
    model = Andrea(small_cfg(causal=False, attn_impl=attn_impl)).eval()
    change = perturbed_logits(model, 5)
    assert torch.all(change > 1e-6), change


def test_the_mask_is_the_layers_own_the_same_weights_under_the_other_mask():
    """model.causal sets every layer's mask (attn.causal) at construction: the same weights built with the other
    setting see the future where the first does not, and the first is unchanged by the second's existence."""
    torch.manual_seed(0)
    causal_model = Andrea(small_cfg(causal=True, n_layer=1)).eval()
    open_model = Andrea(small_cfg(causal=False, n_layer=1)).eval()
    open_model.load_state_dict(causal_model.state_dict())
    assert causal_model.blocks[0].attn.causal and not open_model.blocks[0].attn.causal
    assert torch.all(perturbed_logits(causal_model, 5)[:5] == 0)
    assert torch.all(perturbed_logits(open_model, 5)[:5] > 1e-6)
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # one layer: the last position sees every token either way, so the same logits
        torch.testing.assert_close(causal_model(idx)[0][:, -1], open_model(idx)[0][:, -1])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", ["sqrt", "none", "inv"])
def test_explicit_and_fused_models_agree(causal, scale):
    torch.manual_seed(0)
    explicit = Andrea(small_cfg(causal=causal, scale=scale, attn_impl="explicit", d_k=24, d_v=8))
    fused = Andrea(small_cfg(causal=causal, scale=scale, attn_impl="fused", d_k=24, d_v=8))
    fused.load_state_dict(explicit.state_dict())
    idx = torch.randint(0, 32, (3, 20))
    la, _ = explicit(idx)
    lb, _ = fused(idx)
    torch.testing.assert_close(la, lb, rtol=1e-4, atol=1e-5)
    _, loss_a = explicit(idx, idx)
    _, loss_b = fused(idx, idx)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(explicit.named_parameters(), fused.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-3, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("loss_impl", ["plain", "chunked"])
def test_loss_is_mean_cross_entropy_by_hand(loss_impl):
    torch.manual_seed(0)
    model = Andrea(small_cfg(loss_impl=loss_impl, loss_chunk_rows=3)).eval()
    idx = torch.randint(0, 32, (2, 7))
    targets = torch.randint(0, 32, (2, 7))
    logits, _ = model(idx)
    _, loss = model(idx, targets)
    log_probs = logits.double().log_softmax(-1)
    by_hand = -sum(log_probs[b, t, targets[b, t]] for b in range(2) for t in range(7)) / 14
    assert loss.item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_param_groups_cover_every_parameter_once():
    model = Andrea(small_cfg(qk_layernorm=True))
    decay, no_decay = (g["params"] for g in model.param_groups(0.1))
    ids = [id(p) for p in decay + no_decay]
    assert len(ids) == len(set(ids)) == len({id(p) for p in model.parameters()})
    assert model.param_groups(0.1)[0]["weight_decay"] == 0.1
    assert model.param_groups(0.1)[1]["weight_decay"] == 0.0


@pytest.mark.parametrize("tied", [True, False])
def test_param_groups_decay_matrices_but_not_lookup_tables(tied):
    model = Andrea(small_cfg(qk_layernorm=True, tie_embeddings=tied))
    decay, no_decay = ({id(p) for p in g["params"]} for g in model.param_groups(0.1))
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = {names[i] for i in decay}
    # every linear layer's weight matrix is decayed ...
    linear = {n for n, p in model.named_parameters() if p.dim() == 2 and "emb" not in n and n != "head.weight"}
    assert linear and linear <= decayed
    # ... biases and LayerNorm weights (vectors) and the position table never are
    assert all(p.dim() == 2 for p in model.parameters() if id(p) in decay)
    assert any(n.endswith("bias") for n in names.values()) and any("norm" in n for n in names.values())
    assert id(model.pos_emb.weight) in no_decay
    # the tied token table is the output head and decays like one; an untied token table is a lookup
    assert (id(model.tok_emb.weight) in decay) == tied
    assert id(model.head.weight) in decay


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("qk_layernorm,mask_fill", [(False, "-inf"), (True, "-inf"), (False, -1e9)])
def test_head_major_path_matches_the_captured_path(causal, qk_layernorm, mask_fill):
    """Training runs the explicit path head-major; probes run it batch-first with named stages.
    Same parameters, same batch: the same logits and the same gradients (float64, to rounding)."""
    torch.manual_seed(0)
    cfg = small_cfg(causal=causal, attn_impl="explicit", d_k=24, d_v=8, qk_layernorm=qk_layernorm,
                    mask_fill=mask_fill)
    model = Andrea(cfg).double()
    idx = torch.randint(0, 32, (3, 20))

    def logits_and_grads(capture: bool):
        model.zero_grad(set_to_none=True)
        model.set_capture(capture)
        try:
            logits, _ = model(idx)
            _, loss = model(idx, idx)
        finally:
            model.set_capture(False)
        loss.backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    head_major, head_major_grads = logits_and_grads(False)
    batch_first, batch_first_grads = logits_and_grads(True)
    torch.testing.assert_close(head_major, batch_first, rtol=1e-10, atol=1e-12)
    assert head_major_grads.keys() == batch_first_grads.keys()
    for name, grad in head_major_grads.items():
        torch.testing.assert_close(grad, batch_first_grads[name], rtol=1e-9, atol=1e-12,
                                   msg=lambda m, n=name: f"{n}: {m}")
    assert head_major_grads["blocks.0.attn.q.weight"].abs().sum() > 0  # the weights' gradient went through


@pytest.mark.parametrize("autocast", [False, True])
def test_head_major_projection_is_the_linear_layer_per_head(autocast):
    torch.manual_seed(0)
    attn = Andrea(small_cfg(attn_impl="explicit")).blocks[0].attn
    x = torch.randn(2, 5, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        by_heads = attn.heads_first(x, attn.q, attn.d_k)  # (H, B, T, d_k)
        plain = attn.q(x).view(2, 5, attn.n_head, attn.d_k).permute(2, 0, 1, 3)  # (H, B, T, d_k)
    assert by_heads.dtype == plain.dtype == (torch.bfloat16 if autocast else torch.float32)
    torch.testing.assert_close(by_heads, plain, rtol=1e-2 if autocast else 1e-5, atol=1e-2 if autocast else 1e-6)



# B != n_head, so a limit read along the wrong dim fails; limits 1 (a single key), mid and full length
VISIBLE = torch.tensor([5, 1, 12])
# the model's attention paths: (attn_impl, capture)
PATHS = {"fused": ("fused", False), "head_major": ("explicit", False), "bilinear": ("bilinear", False),
         "captured": ("explicit", True)}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("causal", [True, False])
def test_visible_keys_hide_later_tokens(path, causal):
    """Row b with visible_keys p: tokens at positions >= p change nothing at positions < p, and those
    positions give what a forward over the first p tokens alone gives."""
    attn_impl, capture = PATHS[path]
    torch.manual_seed(0)
    model = Andrea(small_cfg(causal=causal, attn_impl=attn_impl)).eval()
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 32, (3, 12), generator=gen)
    later = torch.randint(0, 32, (3, 12), generator=gen)
    other = torch.where(torch.arange(12) >= VISIBLE[:, None], later, idx)  # each row's later tokens redrawn
    assert not torch.equal(other, idx)
    model.set_capture(capture)
    with torch.no_grad():
        a, _ = model(idx, visible_keys=VISIBLE)
        b_, _ = model(other, visible_keys=VISIBLE)
        for b, p in enumerate(VISIBLE.tolist()):
            assert torch.equal(a[b, :p], b_[b, :p]), (b, p)  # absent keys weigh exactly 0
            prefix, _ = model(idx[b:b + 1, :p])  # (1, p, V): the forward over the prefix alone
            torch.testing.assert_close(a[b:b + 1, :p], prefix, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("causal", [True, False])
def test_visible_keys_at_full_length_is_the_plain_forward(path, causal):
    attn_impl, capture = PATHS[path]
    torch.manual_seed(0)
    model = Andrea(small_cfg(causal=causal, attn_impl=attn_impl)).eval()
    model.set_capture(capture)
    idx = torch.randint(0, 32, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain, _ = model(idx)
        full, _ = model(idx, visible_keys=torch.full((3,), 12))
    assert torch.equal(full, plain)


@pytest.mark.parametrize("causal", [True, False])
def test_captured_pattern_puts_no_mass_on_absent_keys_with_a_finite_fill(causal):
    """mask_fill -1e9 is how the model masks the future; absent keys are -inf regardless: zero mass in
    every layer, and the same logits as with the -inf fill (a -1e9 fill also leaves 0 after softmax here)."""
    torch.manual_seed(0)
    model = Andrea(small_cfg(causal=causal, attn_impl="explicit", mask_fill=-1e9)).eval()
    captured = model.set_capture(True)
    idx = torch.randint(0, 32, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(idx, visible_keys=VISIBLE)
    for layer, stages in enumerate(captured):
        assert stages["pattern"].shape == (3, 4, 12, 12)
        for b, p in enumerate(VISIBLE.tolist()):
            assert torch.all(stages["pattern"][b, :, :, p:] == 0), (layer, b, p)
            assert torch.all(stages["scores"][b, :, :, p:] == -math.inf), (layer, b, p)
            if causal:  # the future inside the limit keeps the model's own fill
                future = torch.ones(p, p, dtype=torch.bool).triu(1)
                assert torch.all(stages["scores"][b, :, :p, :p][:, future] == -1e9), (layer, b, p)


def test_forced_flash_backend_lets_masked_rows_pick_another_kernel(monkeypatch):
    """Flash takes no attn_mask: calls with visible_keys go to PyTorch's choice, training keeps flash."""
    import andrea_exp.model.attention as module

    backends = []
    real = module.fused_attention
    monkeypatch.setattr(module, "fused_attention", lambda *a, **kw: backends.append(kw["backend"]) or real(
        *a, **{**kw, "backend": "auto"}))
    model = Andrea(small_cfg(causal=False, attn_impl="fused", sdpa_backend="flash", n_layer=1)).eval()
    idx = torch.randint(0, 32, (3, 12))
    with torch.no_grad():
        model(idx)
        model(idx, visible_keys=VISIBLE)
    assert backends == ["flash", "auto"]


@pytest.mark.parametrize("d_k,qk_layernorm,mask_fill,expected", [
    (16, False, "-inf", "fused"), (16, False, -1e9, "explicit"), (300, False, "-inf", "bilinear"),
    (300, True, "-inf", "explicit"), (64, False, -1e9, "explicit"), (65, False, -1e9, "bilinear")])
def test_auto_attention_path(d_k, qk_layernorm, mask_fill, expected):
    """auto: fused up to head dim 256 with the -inf fill; beyond, bilinear once d_k > d_model (64 here)."""
    model = Andrea(small_cfg(d_k=d_k, qk_layernorm=qk_layernorm, mask_fill=mask_fill, n_layer=1))
    assert model.blocks[0].attn.impl == expected


@pytest.mark.parametrize("scale", ["sqrt", "none"])
@pytest.mark.parametrize("causal", [True, False])
def test_bilinear_form_is_the_same_function_and_gradient(scale, causal):
    """x_i (W_q^T W_k) x_j = q_i . k_j: in float64 the loss and every gradient agree with the explicit path to
    rounding, here at d_k 96 > d_model 64 with unit-variance q, k (unscaled scores of std ~10)."""
    torch.manual_seed(0)
    cfg = dict(d_k=96, d_v=8, qk_init="unit", scale=scale, causal=causal)
    explicit = Andrea(small_cfg(attn_impl="explicit", **cfg)).double()
    bilinear = Andrea(small_cfg(attn_impl="bilinear", **cfg)).double()
    bilinear.load_state_dict(explicit.state_dict())
    idx = torch.randint(0, 32, (3, 21), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (explicit, bilinear):
        _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-12)
    for (name, a), b in zip(explicit.named_parameters(), bilinear.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def test_position_rows_and_their_gradient_are_the_lookups():
    """The position table's first T rows, sliced, give the forward and the gradient of a lookup of 0..T-1;
    a sequence longer than the table is refused in one line."""
    torch.manual_seed(0)
    model = Andrea(small_cfg(n_layer=1)).double()
    idx = torch.randint(0, 32, (3, 11))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    loss.backward()
    sliced = model.pos_emb.weight.grad.clone()
    assert sliced[10:].abs().max() == 0 and sliced[:10].abs().min() > 0  # rows of positions not seen get none
    model.zero_grad()
    lookup = model.pos_emb(torch.arange(10))  # (T, d_model): what the lookup gave
    torch.testing.assert_close(model.pos_emb.weight[:10], lookup)
    h = model.tok_emb(idx[:, :-1]) + lookup
    for block in model.blocks:
        h = block(h)
    F.cross_entropy(model.head(model.ln_f(h)).flatten(0, 1), idx[:, 1:].reshape(-1)).backward()
    torch.testing.assert_close(sliced, model.pos_emb.weight.grad, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match=r"a sequence of 33 tokens exceeds model.block_size \(32\)"):
        model(torch.zeros(1, 33, dtype=torch.long))
