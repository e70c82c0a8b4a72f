"""The probe: its gradients against an independent computation, and that it never changes training."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import CONF_DIR, probe_settings, tiny

from andrea_exp.instruments.probe import ATTN_STATS, Probe
from andrea_exp.model.decoder import Andrea, ModelConfig
from andrea_exp.runs import metric_keys as mk

PROBE_CFG = probe_settings(every=1, batch_size=4, maps_every=0, maps_heads=2, per_head=False)


def tiny_model(**overrides) -> Andrea:
    fields = dict(vocab_size=16, block_size=16, d_model=32, n_layer=2, n_head=2, d_k=8, d_v=8)
    fields.update(overrides)
    return Andrea(ModelConfig(**fields))


def probe_batch(vocab=16, B=4, T=12, seed=1):
    return torch.randint(0, vocab, (B, T + 1), generator=torch.Generator().manual_seed(seed))


def reference_forward(model: Andrea, idx, targets):
    """The model written out by hand from its weights, with a zero tensor added to each layer's
    (scaled, masked) scores: the gradient with respect to that zero is d loss / d scores."""
    cfg = model.cfg
    B, T = idx.shape
    H, dk, dv = cfg.n_head, cfg.d_k, cfg.d_v
    x = model.tok_emb.weight[idx] + model.pos_emb.weight[:T]  # (B, T, C)
    taps = []
    for blk in model.blocks:
        a = blk.attn
        h = F.layer_norm(x, (cfg.d_model,), blk.ln_1.weight, blk.ln_1.bias)
        q = (h @ a.q.weight.T).reshape(B, T, H, dk).permute(0, 2, 1, 3)  # (B, H, T, dk)
        k = (h @ a.k.weight.T).reshape(B, T, H, dk).permute(0, 2, 1, 3)
        v = (h @ a.v.weight.T).reshape(B, T, H, dv).permute(0, 2, 1, 3)
        s = torch.einsum("bhid,bhjd->bhij", q, k) * a.scale  # (B, H, T, T)
        if a.causal:
            s = s.masked_fill(torch.arange(T)[None, :] > torch.arange(T)[:, None], -math.inf)
        tap = torch.zeros_like(s, requires_grad=True)
        taps.append(tap)
        s = s + tap
        e = torch.exp(s - s.max(-1, keepdim=True).values)
        p = e / e.sum(-1, keepdim=True)
        out = torch.einsum("bhij,bhjd->bhid", p, v).permute(0, 2, 1, 3).reshape(B, T, H * dv)
        x = x + out @ a.o.weight.T
        h2 = F.layer_norm(x, (cfg.d_model,), blk.ln_2.weight, blk.ln_2.bias)
        m = h2 @ blk.mlp.fc.weight.T + blk.mlp.fc.bias
        m = 0.5 * m * (1 + torch.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m**3)))
        x = x + m @ blk.mlp.proj.weight.T + blk.mlp.proj.bias
        x = F.layer_norm(x, (cfg.d_model,), model.ln_f.weight, model.ln_f.bias) if blk is model.blocks[-1] else x
    logits = x @ model.head.weight.T  # (B, T, V)
    logp = logits - logits.logsumexp(-1, keepdim=True)
    loss = -logp.gather(-1, targets.unsqueeze(-1)).mean()
    return loss, taps


def norm(ts):
    return math.sqrt(sum(float(t.pow(2).sum()) for t in ts))


@pytest.mark.parametrize("causal", [True, False])
def test_gradients_match_an_independent_computation(causal, tmp_path):
    torch.manual_seed(0)
    model = tiny_model(causal=causal, scale="none")
    tokens = probe_batch()
    got = Probe(model, tokens, PROBE_CFG, tmp_path).measure(0)

    loss, taps = reference_forward(model, tokens[:, :-1], tokens[:, 1:])
    assert got["probe/loss"] == pytest.approx(loss.item(), rel=1e-5)
    blocks = list(model.blocks)
    wanted = {}
    for li, blk in enumerate(blocks):
        for name in ("q", "k", "v", "o"):
            wanted[f"grad/L{li}/{name}"] = [getattr(blk.attn, name).weight]
        wanted[f"grad/L{li}/mlp"] = [blk.mlp.fc.weight, blk.mlp.fc.bias, blk.mlp.proj.weight, blk.mlp.proj.bias]
    wanted["grad/embed"] = [model.tok_emb.weight, model.pos_emb.weight]
    wanted["grad/head"] = [model.head.weight]
    flat = list({id(p): p for ps in wanted.values() for p in ps}.values())
    grads = torch.autograd.grad(loss, taps + flat)
    tap_grads, by_id = grads[: len(taps)], {id(p): g for p, g in zip(flat, grads[len(taps):])}

    for li, g in enumerate(tap_grads):
        assert got[f"grad/L{li}/scores"] == pytest.approx(norm([g]), rel=1e-4)
        if causal:  # softmax sends nothing back to masked entries
            assert g[..., torch.ones(12, 12, dtype=torch.bool).triu(1)].abs().max().item() == 0.0
    assert got["grad/scores"] == pytest.approx(norm(tap_grads), rel=1e-4)
    for key, params in wanted.items():
        assert got[key] == pytest.approx(norm([by_id[id(p)] for p in params]), rel=1e-4), key
    # tied head: one tensor, so grad/head is the token table's (tied) gradient alone
    assert got["grad/head"] == pytest.approx(norm([by_id[id(model.tok_emb.weight)]]), rel=1e-4)
    assert got["grad/scores"] > 0


def test_layer_and_global_values_are_means_of_heads_and_layers(tmp_path):
    torch.manual_seed(0)
    model = tiny_model(n_layer=3, n_head=3)
    cfg = dataclasses.replace(PROBE_CFG, per_head=True)
    got = Probe(model, probe_batch(), cfg, tmp_path).measure(0)
    for stat in ATTN_STATS:
        layer_values = []
        for li in range(3):
            heads = [got[f"attn/L{li}/H{h}/{stat}"] for h in range(3)]
            assert got[f"attn/L{li}/{stat}"] == pytest.approx(sum(heads) / 3, rel=1e-5)
            layer_values.append(got[f"attn/L{li}/{stat}"])
        assert got[f"attn/{stat}"] == pytest.approx(sum(layer_values) / 3, rel=1e-5)
    assert got["attn/q_std"] == pytest.approx(sum(got[f"attn/L{li}/q_std"] for li in range(3)) / 3, rel=1e-6)
    # causal rows 0 have one key: saturated by definition, so at least 1/T of the rows
    assert got["attn/saturated_frac"] >= 1 / 12 - 1e-6
    assert all(math.isfinite(v) for v in got.values())


def test_probe_leaves_training_state_alone(tmp_path):
    torch.manual_seed(0)
    model = tiny_model(dropout=0.3)
    model.train()
    marker = {id(p): torch.full_like(p, 0.5) for p in model.parameters()}
    for p in model.parameters():
        p.grad = marker[id(p)].clone()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rng_before = torch.get_rng_state()
    probe = Probe(model, probe_batch(), PROBE_CFG, tmp_path)
    first = probe.measure(0)
    second = probe.measure(1)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert first == second  # dropout is off during the probe, so the same batch reads the same
    assert model.training
    assert all(blk.attn.stages is None for blk in model.blocks)
    assert all(torch.equal(p.grad, marker[id(p)]) for p in model.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    model.eval()
    assert probe.measure(2) == first
    assert not model.training


def test_capture_off_and_mode_restored_after_an_error(tmp_path):
    model = tiny_model()
    model.train()
    bad = probe_batch(vocab=16)
    bad[0, 0] = 16  # outside the vocabulary: the embedding lookup fails mid-probe
    with pytest.raises(IndexError):
        Probe(model, bad, PROBE_CFG, tmp_path).measure(0)
    assert model.training
    assert all(blk.attn.stages is None for blk in model.blocks)


@pytest.mark.parametrize("d_k", [16, 64, 256])
def test_unit_init_scores_have_std_sqrt_dk_unscaled_and_one_scaled(d_k, tmp_path):
    """qk_init=unit: q, k components of unit variance after LayerNorm, so q.k has std sqrt(d_k).

    Tolerance 10%: one weight draw per head and a 4 x 32 batch; over 8 seeds and both layers the
    reading stayed within 0.96-1.02 of the target at every d_k here.
    """
    readings = {}
    for scale in ("none", "sqrt"):
        torch.manual_seed(3)
        model = tiny_model(d_model=64, n_head=4, d_k=d_k, block_size=32, vocab_size=32, scale=scale, qk_init="unit")
        got = Probe(model, probe_batch(vocab=32, T=32), PROBE_CFG, tmp_path).measure(0)
        readings[scale] = got["attn/score_std"]
        assert got["attn/q_std"] == pytest.approx(1.0, rel=0.1)
        assert got["attn/k_std"] == pytest.approx(1.0, rel=0.1)
    assert readings["none"] == pytest.approx(math.sqrt(d_k), rel=0.1)
    assert readings["sqrt"] == pytest.approx(1.0, rel=0.1)


def test_draw_maps_writes_pngs_of_first_and_last_layer(tmp_path):
    torch.manual_seed(0)
    model = tiny_model(n_layer=3)
    model.train()
    maps = Probe(model, probe_batch(), PROBE_CFG, tmp_path).draw_maps(500)
    assert set(maps) == {"attn_map/L0", "attn_map/L2"}
    for path in maps.values():
        assert path.parent == tmp_path / "attention_maps"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert model.training and all(blk.attn.stages is None for blk in model.blocks)


def row_norms_by_layer(tap_grads, causal: bool) -> list[torch.Tensor]:
    """||d loss / d S_i|| of every kept (batch, head, query) row, per layer, from the reference gradients."""
    first = 1 if causal else 0  # a causal row 0 sees a single key
    return [g[..., first:, :].norm(dim=-1).flatten() for g in tap_grads]


def expected_row_stats(rows: torch.Tensor, dead: float) -> dict[str, float]:
    q10, q50, q90 = torch.quantile(rows.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64)).tolist()
    squares = (rows.double() ** 2).sort(descending=True).values
    top = math.ceil(0.1 * rows.numel())
    return {mk.GRAD_SCORES_ROW_P10: q10, mk.GRAD_SCORES_ROW_P50: q50, mk.GRAD_SCORES_ROW_P90: q90,
            mk.GRAD_SCORES_DEAD_FRAC: (rows < dead).double().mean().item(),
            mk.GRAD_SCORES_TOP10_SHARE: (squares[:top].sum() / squares.sum()).item()}


@pytest.mark.parametrize("causal", [True, False])
def test_row_gradient_statistics_match_an_independent_computation(causal, tmp_path):
    torch.manual_seed(0)
    model = tiny_model(causal=causal, scale="none")
    tokens = probe_batch()
    loss, taps = reference_forward(model, tokens[:, :-1], tokens[:, 1:])
    rows = row_norms_by_layer(torch.autograd.grad(loss, taps), causal)  # 2 x (B * H * kept rows,)
    assert rows[0].numel() == 4 * 2 * (11 if causal else 12)
    ranked = rows[0].sort().values
    dead = float(ranked[29] + ranked[30]) / 2  # between two order statistics: 30 rows of layer 0 below it
    got = Probe(model, tokens, dataclasses.replace(PROBE_CFG, dead_grad=dead), tmp_path).measure(0)

    for li in range(2):
        for key, want in expected_row_stats(rows[li], dead).items():
            assert got[mk.per_layer(key, li)] == pytest.approx(want, rel=1e-4), mk.per_layer(key, li)
    assert got[mk.per_layer(mk.GRAD_SCORES_DEAD_FRAC, 0)] == pytest.approx(30 / rows[0].numel())
    assert got[mk.GRAD_SCORES_ROW_P50] != pytest.approx(got[mk.per_layer(mk.GRAD_SCORES_ROW_P50, 0)], rel=1e-3)
    # pooled: quantiles and the top share over all rows of both layers; the dead fraction a mean over layers
    pooled = expected_row_stats(torch.cat(rows), dead)
    for key in (mk.GRAD_SCORES_ROW_P10, mk.GRAD_SCORES_ROW_P50, mk.GRAD_SCORES_ROW_P90, mk.GRAD_SCORES_TOP10_SHARE):
        assert got[key] == pytest.approx(pooled[key], rel=1e-4), key
    assert got[mk.GRAD_SCORES_DEAD_FRAC] == pytest.approx(
        (got["grad/L0/scores_dead_frac"] + got["grad/L1/scores_dead_frac"]) / 2)
    assert all(mk.is_known(key) for key in got)


def dense_jacobian_norms(pattern: torch.Tensor) -> torch.Tensor:
    """(..., T) rows -> (...) ||diag(p) - p p^T||_F from the matrix itself."""
    p = pattern.double()
    return torch.linalg.matrix_norm(torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2))


@pytest.mark.parametrize("causal", [True, False])
def test_per_layer_labels_come_from_their_own_layer(causal, tmp_path):
    """Layer 0 made nearly one-hot (large W_q, no scaling), layer 1 exactly uniform (W_q = 0): each
    attn/L{l}/ value must be its own layer's, checked against the pattern captured from that layer."""
    torch.manual_seed(0)
    model = tiny_model(causal=causal, scale="none")
    with torch.no_grad():
        model.blocks[0].attn.q.weight.mul_(40.0)
        model.blocks[1].attn.q.weight.zero_()
    tokens = probe_batch()
    got = Probe(model, tokens, PROBE_CFG, tmp_path).measure(0)

    T, first = 12, (1 if causal else 0)
    n_keys = torch.arange(1, T + 1) if causal else torch.full((T,), T)
    uniform = (1 / n_keys[first:] - 1 / n_keys[first:] ** 2).double().sqrt().mean().item()
    assert got["attn/L1/jac_norm"] == pytest.approx(uniform, rel=1e-5)  # worked out by hand
    assert got["attn/L1/jac_dead_frac"] == 0.0
    assert got["attn/L0/jac_dead_frac"] > 0.5 and got["attn/L0/jac_norm"] < 0.2 * uniform

    stages = model.set_capture(True)
    with torch.no_grad():
        model.eval()
        model(tokens[:, :-1])
    model.set_capture(False)
    for li in range(2):
        norms = dense_jacobian_norms(stages[li]["pattern"][..., first:, :])  # (B, H, kept rows)
        assert got[f"attn/L{li}/jac_norm"] == pytest.approx(norms.mean().item(), rel=1e-5, abs=1e-7)
        assert got[f"attn/L{li}/jac_dead_frac"] == pytest.approx((norms < 1e-3).double().mean().item())
    assert got[mk.ATTN_JAC_NORM] == pytest.approx((got["attn/L0/jac_norm"] + got["attn/L1/jac_norm"]) / 2)
    assert got[mk.ATTN_JAC_DEAD_FRAC] == pytest.approx(got["attn/L0/jac_dead_frac"] / 2)

    # the older per-layer statistics follow the same labels
    assert got["attn/L1/entropy_norm"] == pytest.approx(1.0, rel=1e-5)  # uniform over the visible keys
    assert got["attn/L1/score_std"] == 0.0 and got["attn/L0/score_std"] > 10
    assert got["attn/L0/max_prob"] > 0.9 > got["attn/L1/max_prob"]
    assert got["attn/L1/qk_spectral"] == 0.0  # W_q = 0
    assert got["attn/L0/qk_spectral"] == pytest.approx(direct_qk_spectral(model, 0), rel=1e-5)
    assert got[mk.ATTN_QK_SPECTRAL] == got["attn/L0/qk_spectral"]  # max over layers


def direct_qk_spectral(model: Andrea, layer: int) -> float:
    """Max over heads of the largest singular value of scale * W_q^h^T W_k^h, by a full SVD."""
    attn, d_k = model.blocks[layer].attn, model.cfg.d_k
    values = []
    for h in range(model.cfg.n_head):
        rows = slice(h * d_k, (h + 1) * d_k)
        form = attn.scale * attn.q.weight[rows].double().T @ attn.k.weight[rows].double()  # (d_model, d_model)
        values.append(torch.linalg.svdvals(form.detach())[0].item())
    return max(values)


@pytest.mark.parametrize("d_k", [4, 64])  # below and above d_model = 32
def test_qk_spectral_matches_a_direct_svd_and_scales_with_the_scale_setting(d_k, tmp_path):
    readings = {}
    for scale in ("none", "sqrt", "inv"):
        torch.manual_seed(5)  # the same weights for every scale setting
        model = tiny_model(d_k=d_k, n_head=3, scale=scale)
        got = Probe(model, probe_batch(), PROBE_CFG, tmp_path).measure(0)
        for li in range(2):
            assert got[f"attn/L{li}/qk_spectral"] == pytest.approx(direct_qk_spectral(model, li), rel=1e-5)
        assert got[mk.ATTN_QK_SPECTRAL] == max(got["attn/L0/qk_spectral"], got["attn/L1/qk_spectral"])
        readings[scale] = got[mk.ATTN_QK_SPECTRAL]
    assert readings["none"] / readings["sqrt"] == pytest.approx(math.sqrt(d_k), rel=1e-5)
    assert readings["none"] / readings["inv"] == pytest.approx(d_k, rel=1e-5)


def test_qk_spectral_with_qk_layernorm_reads_the_gains(tmp_path):
    torch.manual_seed(0)
    model = tiny_model(qk_layernorm=True, d_k=8)
    got = Probe(model, probe_batch(), PROBE_CFG, tmp_path).measure(0)
    assert got[mk.ATTN_QK_SPECTRAL] == pytest.approx(1 / math.sqrt(8), rel=1e-6)  # unit gains: scale * 1
    with torch.no_grad():
        model.blocks[1].attn.q_norm.weight.copy_(torch.arange(1.0, 9.0))
        model.blocks[1].attn.k_norm.weight.fill_(2.0)
        model.blocks[0].attn.q.weight.mul_(100.0)  # the projection's size is normalised away
    got = Probe(model, probe_batch(), PROBE_CFG, tmp_path).measure(0)
    centre = torch.eye(8, dtype=torch.float64) - 1 / 8
    form = centre @ torch.diag(2.0 * torch.arange(1.0, 9.0, dtype=torch.float64)) @ centre / math.sqrt(8)
    assert got["attn/L0/qk_spectral"] == pytest.approx(1 / math.sqrt(8), rel=1e-6)
    assert got["attn/L1/qk_spectral"] == pytest.approx(torch.linalg.svdvals(form)[0].item(), rel=1e-6)


def test_dead_thresholds_are_read_from_the_probe_settings(tmp_path):
    torch.manual_seed(0)
    model, tokens = tiny_model(), probe_batch()
    default = Probe(model, tokens, PROBE_CFG, tmp_path).measure(0)
    assert default[mk.ATTN_JAC_DEAD_FRAC] == 0.0 and default[mk.GRAD_SCORES_DEAD_FRAC] < 0.5
    cfg = dataclasses.replace(PROBE_CFG, dead_jac=1.0, dead_grad=1e3)  # every row is below both
    got = Probe(model, tokens, cfg, tmp_path).measure(0)
    assert got[mk.ATTN_JAC_DEAD_FRAC] == 1.0 and got[mk.GRAD_SCORES_DEAD_FRAC] == 1.0
    assert got["attn/L1/jac_dead_frac"] == 1.0 and got["grad/L0/scores_dead_frac"] == 1.0


@pytest.mark.parametrize("override, line", [
    ("probe.maps_heads=0", "probe.maps_heads must be an integer >= 1; got 0"),
    ("probe.per_head=maybe", "probe.per_head must be one of True, False; got 'maybe'"),
    ("probe.dead_jac=0", "probe.dead_jac must be a finite number > 0; got 0.0"),
    ("probe.dead_jac=x", "probe.dead_jac must be a finite number > 0; got 'x'"),
    ("probe.dead_grad=-1e-6", "probe.dead_grad must be a finite number > 0; got -1e-06"),
])
def test_bad_probe_settings_are_named_once_before_the_run(override, line):
    """The probe reads its settings as validated: a bad one is the command line's one line, before any run."""
    from andrea_exp.config.validation import command_line_error

    assert command_line_error([*tiny(), override], CONF_DIR) == line


def run_cli(run_dir, *overrides):
    cmd = [sys.executable, "-m", "andrea_exp", "train.max_steps=30", "train.log_every=5", "train.eval_every=10",
           "data.train_sequences=512", "data.eval_sequences=16", "train.progress=false", "logger.mode=disabled",
           f"hydra.run.dir={run_dir}", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny model: one thread is fastest, and the same in both runs
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300, env=env)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_probes_every_step_leave_the_training_curve_identical(tmp_path):
    with_probe = run_cli(tmp_path / "on", "probe.every=1", "probe.maps_every=10")
    without = run_cli(tmp_path / "off", "probe.every=0")

    def curve(records, key):
        return [(r["step"], r[key]) for r in records if key in r]

    for key in ("train/loss", "grad/norm", "eval/loss_as_trained"):
        assert curve(with_probe, key) == curve(without, key), key
    assert len(curve(without, "train/loss")) == 30
    probed_steps = [r["step"] for r in with_probe if "attn/entropy" in r]
    assert probed_steps == list(range(31))  # every step, and once more after the last
    assert not any("attn/entropy" in r for r in without)
    assert len(list((tmp_path / "on" / "attention_maps").glob("*.png"))) == 2 * 4  # steps 0, 10, 20, last (30)


def test_the_probe_reads_the_mask_from_the_layers(tmp_path):
    """The layers' own mask decides the kept rows and the visible entries, not a setting beside them."""
    import dataclasses

    model = tiny_model(causal=True, scale="none")
    tokens = probe_batch()
    want = Probe(model, tokens, PROBE_CFG, tmp_path).measure(0)
    model.cfg = dataclasses.replace(model.cfg, causal=False)  # a stale setting: every layer still masks the future
    got = Probe(model, tokens, PROBE_CFG, tmp_path).measure(0)
    assert got.keys() == want.keys()
    assert all(got[key] == want[key] or (math.isnan(got[key]) and math.isnan(want[key])) for key in want)
