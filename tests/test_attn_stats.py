"""train.attn_stats: the fused statistics pass equals the explicit pipeline, in the model, the loop and the logs.

Reference: attn_stats.reference_head_stats, i.e. attention.explicit_attention ((B, H, T, T) scores, float32
softmax) reduced by the probe's metrics.head_attention_stats, run in float32 on the very values of q and k
(bf16 inputs upcast exactly). Tolerances, stated once:
- REL: |got - ref| <= 1e-4 (1 + |ref|) for score_max, entropy, entropy_norm, max_prob, max_prob_max;
- saturated_frac: within 1.5 rows of the B * T (a row whose max probability sits within rounding of 0.99
  may fall either side);
- against the explicit pipeline run *in bf16* (which rounds its scores to bf16 before the softmax, as the
  fused kernels do not): 1e-2 (1 + |ref|), and saturated_frac within 1% + 4 rows.

The kernel tests (marked gpu) run the Triton kernels on CUDA; on a CPU machine with Triton installed they
also run under Triton's interpreter when TRITON_INTERPRET=1 is set (bf16 excepted: the interpreter has no
bf16 arithmetic). Elsewhere they skip.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from conftest import compose_tiny
from torch.nn.attention import SDPBackend, sdpa_kernel

from andrea_exp.config.validation import ConfigError, validate
from andrea_exp.instruments import attn_stats
from andrea_exp.instruments.attn_stats import STATS, head_stats, head_stats_torch, reference_head_stats
from andrea_exp.model.decoder import Andrea, ModelConfig
from andrea_exp.model.step_stats import SATURATION
from andrea_exp.runs import metric_keys as K

REL = 1e-4
BF16_REL = 1e-2
TS = (1, 2, 17, 128, 1024)
D_KS = (16, 64, 256)
FILLS = (-math.inf, -1e9)


def kernel_device() -> str | None:
    """Where the Triton kernels can run: cuda, cpu (Triton's interpreter), or None."""
    if not attn_stats.triton_available():
        return None
    if torch.cuda.is_available():
        return "cuda"
    return "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else None


# The kernels' tests are marked gpu(triton_interpreter=True): without CUDA they run only under the interpreter;
# the fused pass's (and a kernel's in bf16, which the interpreter has no arithmetic for) gpu(triton=True)
kernel_gpu = pytest.mark.gpu(triton_interpreter=True)
triton_gpu = pytest.mark.gpu(triton=True)


@pytest.fixture(autouse=True)
def exact_float32_matmuls():
    """The torch path's float32 q k^T in full float32 (runtime.setup_runtime turns TF32 on for training)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def random_qk(T: int, d: int, dtype=torch.float32, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    B, H = (1, 2) if T >= 1024 else (2, 3)
    q, k = (torch.randn(B, H, T, d, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    return q, k


def assert_close(got: torch.Tensor, ref: torch.Tensor, rows: int, rel: float = REL, saturated_rows: float = 1.5,
                 saturated_share: float = 0.0, where: str = "") -> None:
    """(N_STATS, H) against (N_STATS, H) with the tolerances of the module docstring; nan where ref is nan."""
    got, ref = got.float().cpu(), ref.float().cpu()
    assert got.shape == ref.shape
    for name, g, r in zip(STATS, got, ref):
        assert torch.equal(g.isnan(), r.isnan()), f"{where} {name}: nan pattern {g} vs {r}"
        g, r = g[~r.isnan()], r[~r.isnan()]
        if name == "saturated_frac":
            bound = saturated_rows / rows + saturated_share
            assert (g - r).abs().max().item() <= bound if g.numel() else True, f"{where} {name}: {g} vs {r}"
        else:
            assert ((g - r).abs() <= rel * (1 + r.abs())).all(), f"{where} {name}: {g} vs {r}"


def check_against_explicit(T, d, causal, scaled, fill, dtype, impl, device):
    q, k = random_qk(T, d, dtype, device)
    scale = 1 / math.sqrt(d) if scaled else 1.0
    got = head_stats(q, k, scale=scale, causal=causal, impl=impl)
    ref = reference_head_stats(q.double(), k.double(), scale=scale, causal=causal, mask_fill=fill)
    rows = q.size(0) * T
    assert_close(got, ref, rows, where=f"T {T} d {d} causal {causal} scaled {scaled} fill {fill} {dtype}")
    if dtype == torch.bfloat16:  # the explicit pipeline as it runs in bf16: scores rounded to bf16
        ref_bf16 = reference_head_stats(q, k, scale=scale, causal=causal, mask_fill=fill)
        assert_close(got, ref_bf16, rows, rel=BF16_REL, saturated_rows=4, saturated_share=0.01, where="bf16 explicit")


def grid():
    for T in TS:
        for d in D_KS:
            for causal in (True, False):
                for fill in FILLS if causal else FILLS[:1]:  # without the mask nothing is filled
                    for scaled in (True, False):
                        for dtype in (torch.float32, torch.bfloat16):
                            yield pytest.param(T, d, causal, scaled, fill, dtype,
                                               id=f"T{T}-d{d}-{'causal' if causal else 'full'}-"
                                                  f"{'scaled' if scaled else 'unscaled'}-fill{fill:g}-"
                                                  f"{str(dtype).split('.')[-1]}")


# ---------------------------------------------------------------- the PyTorch path (CPU)


@pytest.mark.parametrize("T, d, causal, scaled, fill, dtype", list(grid()))
def test_torch_path_equals_the_explicit_pipeline(T, d, causal, scaled, fill, dtype):
    check_against_explicit(T, d, causal, scaled, fill, dtype, "torch", "cpu")


def test_one_hot_rows_have_entropy_zero_and_max_prob_one():
    T, d = 17, 32
    keys = torch.eye(T, d)[None, None] * 40.0  # (1, 1, T, d): key j is 40 e_j
    q = keys.clone()  # q_i . k_j = 1600 [i == j]: each row puts its mass on its own key
    for causal in (True, False):
        got = head_stats_torch(q, keys, 1.0, causal)
        values = dict(zip(STATS, got[:, 0].tolist()))
        assert values["entropy"] == pytest.approx(0.0, abs=1e-6)
        assert values["entropy_norm"] == pytest.approx(0.0, abs=1e-6)
        assert values["max_prob"] == pytest.approx(1.0, abs=1e-6)
        assert values["max_prob_max"] == pytest.approx(1.0, abs=1e-6)
        assert values["saturated_frac"] == 1.0
        assert values["score_max"] == pytest.approx(1600.0)
        assert_close(got, reference_head_stats(q, keys, scale=1.0, causal=causal), T)


def test_uniform_rows_have_entropy_log_n():
    T, d = 17, 8
    q, k = torch.zeros(2, 3, T, d), torch.randn(2, 3, T, d)  # every score 0
    n = torch.arange(1, T + 1, dtype=torch.float64)
    for causal, n_vis in ((True, n), (False, torch.full((T,), float(T), dtype=torch.float64))):
        got = dict(zip(STATS, head_stats_torch(q, k, 0.125, causal)[:, 0].tolist()))
        assert got["entropy"] == pytest.approx(n_vis.log().mean().item(), rel=1e-6)
        assert got["entropy_norm"] == pytest.approx(1.0, rel=1e-6)
        assert got["max_prob"] == pytest.approx((1 / n_vis).mean().item(), rel=1e-6)
        assert got["max_prob_max"] == pytest.approx(0.5 if causal else 1 / T, rel=1e-6)  # row 1 sees two keys
        assert got["saturated_frac"] == pytest.approx(1 / T if causal else 0.0)  # causal row 0: one key, p = 1
        assert got["score_max"] == 0.0


def adversarial_qk(case: str, dtype: torch.dtype, device="cpu"):
    """(q, k, scale) whose rows are saturated at large logits, where a softmax's rounding shows: max_prob must stay
    <= 1 (and entropy >= 0) row by row, i.e. max_prob_max <= 1.

    one-hot: q_i = a_i e_i, k_j = b_j e_j, so row i puts all its mass on key i at a logit a_i b_i spread over
    300..6000 in 300 distinct values (some round up, some down when scaled); large: randn * 20 (logits of
    thousands, every row saturated); rising: q_i . k_j = 40 j, each key block holds a new row max (the online
    rescaling on every block)."""
    T, d = 300, 64
    gen = torch.Generator().manual_seed(3)
    if case == "one-hot":
        a = torch.linspace(17.0, 77.0, T)
        b = torch.linspace(300.0, 6000.0, T) / a
        q = torch.zeros(1, 1, T, d)
        k = torch.zeros(1, 1, T, d)
        q[0, 0, torch.arange(T), torch.arange(T) % d] = a
        k[0, 0, torch.arange(T), torch.arange(T) % d] = b  # keys i and i + d share a component: rows see both
        return q.to(device, dtype), k.to(device, dtype), 1.0
    if case == "large":
        q, k = (20 * torch.randn(2, 3, T, d, generator=gen) for _ in range(2))
        return q.to(device, dtype), k.to(device, dtype), d ** -0.5
    u = torch.randn(d, generator=gen)
    u = u / u.norm()
    q = u.expand(1, 2, T, d).clone()
    k = (40.0 * torch.arange(T))[:, None] * u  # (T, d)
    return q.to(device, dtype), k[None, None].expand(1, 2, T, d).to(device, dtype), 1.0


def assert_probabilities(got: torch.Tensor, where: str) -> None:
    values = {name: got[i] for i, name in enumerate(STATS)}
    assert (values["max_prob_max"] <= 1.0).all(), f"{where}: max_prob_max {values['max_prob_max'].tolist()}"
    assert (values["max_prob"] <= 1.0).all(), f"{where}: max_prob {values['max_prob'].tolist()}"
    assert (values["entropy"] >= 0.0).all() and (values["entropy_norm"] >= 0.0).all(), where
    assert ((values["saturated_frac"] >= 0.0) & (values["saturated_frac"] <= 1.0)).all(), where


ADVERSARIAL = [(case, dtype) for case in ("one-hot", "large", "rising") for dtype in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("case, dtype", ADVERSARIAL, ids=[f"{c}-{str(d).split('.')[-1]}" for c, d in ADVERSARIAL])
def test_max_probability_never_exceeds_one_on_adversarial_inputs(case, dtype):
    q, k, scale = adversarial_qk(case, dtype)
    for causal in (True, False):
        for key_chunk in (256, 7):  # one block of keys per row or many, the max moving from block to block
            got = head_stats_torch(q, k, scale, causal, key_chunk=key_chunk)
            assert_probabilities(got, f"{case} {dtype} causal {causal} chunk {key_chunk}")
        if case == "one-hot":  # every row saturated on one key: exactly 1, not 1 - rounding
            assert (got[STATS.index("max_prob_max")] == 1.0).all()
            assert (got[STATS.index("saturated_frac")] == 1.0).all()


def rising_keys(T: int = 64, d: int = 16):
    """q_i . k_j = 8 j / T: every row prefers the latest key it may see, so the future would dominate."""
    u = torch.randn(d)
    u = u / u.norm()
    q = u.expand(1, 1, T, d).clone()
    k = (8.0 * torch.arange(T) / T)[:, None] * u  # (T, d)
    return q, k[None, None].clone()


def test_the_statistics_fail_if_the_mask_is_ignored():
    q, k = rising_keys()
    causal = reference_head_stats(q, k, scale=1.0, causal=True)
    full = reference_head_stats(q, k, scale=1.0, causal=False)
    got = head_stats_torch(q, k, 1.0, True)
    assert_close(got, causal, q.size(2))
    # the same kernel with the mask ignored would give `full`: the test above tells the two apart by far
    for name in ("entropy", "entropy_norm", "max_prob"):
        i = STATS.index(name)
        assert (causal[i] - full[i]).abs().min() > 100 * REL * (1 + full[i].abs().max()), name
    with pytest.raises(AssertionError):
        assert_close(head_stats_torch(q, k, 1.0, False), causal, q.size(2))


def test_a_finite_fill_gives_what_minus_inf_gives():
    q, k = random_qk(128, 64)
    assert_close(reference_head_stats(q, k, scale=0.125, causal=True, mask_fill=-1e9),
                 reference_head_stats(q, k, scale=0.125, causal=True), 2 * 128, rel=1e-6)


def test_key_chunking_does_not_change_the_values():
    q, k = random_qk(100, 16)
    assert_close(head_stats_torch(q, k, 0.25, True, key_chunk=7), head_stats_torch(q, k, 0.25, True, key_chunk=256),
                 200, rel=1e-5)


def test_the_op_dispatches_to_the_torch_path_on_the_cpu_and_stays_off_autograd():
    q, k = random_qk(33, 16)
    q.requires_grad_(True)
    got = head_stats(q, k, scale=0.25, causal=True)
    assert not got.requires_grad and got.dtype == torch.float32 and got.shape == (len(STATS), 3)
    assert torch.equal(got, head_stats_torch(q.detach(), k, 0.25, True))


# ---------------------------------------------------------------- in the model (CPU)


def tiny_model(**fields) -> Andrea:
    torch.manual_seed(0)
    cfg = dict(vocab_size=32, block_size=16, d_model=32, n_layer=2, n_head=2, d_k=16, d_v=16)
    return Andrea(ModelConfig(**{**cfg, **fields}))


def recorded(model) -> torch.Tensor:
    return torch.stack([block.attn.stats.values.clone() for block in model.blocks])  # (L, N_STATS, H)


def captured_reference(model, idx) -> torch.Tensor:
    """Each layer's statistics from the explicit pipeline on the q, k the probe's capture sees."""
    stages = model.set_capture(True)
    try:
        model(idx, idx)
        return torch.stack([reference_head_stats(st["q"], st["k"], scale=block.attn.scale, causal=block.attn.causal,
                                                 mask_fill=block.attn.mask_fill)
                            for st, block in zip(stages, model.blocks)])
    finally:
        model.set_capture(False)


@pytest.mark.parametrize("fields", [{"attn_impl": "fused"}, {"attn_impl": "explicit"},
                                    {"attn_impl": "bilinear", "d_k": 128}, {"attn_impl": "auto", "d_k": 512},
                                    {"qk_layernorm": True}, {"mask_fill": -1e9}, {"causal": False},
                                    {"scale": "none", "qk_init": "unit"}],
                         ids=["fused", "explicit", "bilinear", "auto-d_k512", "qk_layernorm", "fill-1e9", "full",
                              "unscaled"])
def test_a_training_forward_records_what_the_explicit_pipeline_reads(fields):
    model = tiny_model(**fields)
    attn_stats.enable(model)
    idx = torch.randint(0, 32, (3, 16), generator=torch.Generator().manual_seed(1))
    model.train()
    _, loss = model(idx, idx)
    got = recorded(model)
    ref = captured_reference(model, idx)
    for li in range(len(model.blocks)):
        assert_close(got[li], ref[li], 3 * 16, rel=1e-4, where=f"layer {li}")
    loss.backward()  # the statistics took nothing from autograd


def test_eval_no_grad_probe_and_visible_keys_forwards_leave_the_buffer_alone():
    model = tiny_model()
    attn_stats.enable(model)
    idx = torch.randint(0, 32, (2, 16))
    model.train()
    model(idx, idx)
    before = recorded(model)
    other = torch.randint(0, 32, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        model(other, other)
    model.eval()
    model(other, other)
    model.train()
    model(other, other, visible_keys=torch.tensor([3, 16]))
    captured_reference(model, other)  # the probe's capture
    assert torch.equal(recorded(model), before)
    model(other, other)
    assert not torch.equal(recorded(model), before)


def test_statistics_enabled_on_a_model_in_eval_mode_wait_for_its_training_forward():
    """The layer's statistics follow the layer's mode from the start (enable may come while the model evaluates)."""
    model = tiny_model().eval()
    attn_stats.enable(model)
    idx = torch.randint(0, 32, (2, 16))
    model(idx, idx)
    assert recorded(model).isnan().all()
    model.train()
    model(idx, idx)
    assert not recorded(model).isnan().any()


def test_a_model_without_statistics_has_no_buffers_and_unchanged_state_dict():
    plain, enabled = tiny_model(), tiny_model()
    attn_stats.enable(enabled)
    assert plain.blocks[0].attn.stats is None
    assert plain.state_dict().keys() == enabled.state_dict().keys()  # checkpoints unchanged
    enabled.load_state_dict(plain.state_dict())


@pytest.mark.slow
def test_a_compiled_model_records_the_eager_values():
    model = tiny_model()
    attn_stats.enable(model)
    idx = torch.randint(0, 32, (3, 16))
    model(idx, idx)
    eager = recorded(model)
    for block in model.blocks:
        block.attn.stats.values.zero_()
    compiled = torch.compile(model)
    _, loss = compiled(idx, idx)
    loss.backward()
    assert torch.allclose(recorded(model), eager, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- rows and keys


def test_metric_rows_pool_heads_and_layers_and_name_registered_keys():
    values = torch.arange(2 * 3 * len(STATS) * 2, dtype=torch.float32).reshape(2, 3, len(STATS), 2)  # (steps, L, S, H)
    rows = attn_stats.metric_rows(values, per_head=True)
    assert len(rows) == 2
    row = rows[1]
    sm, ent = STATS.index("score_max"), STATS.index("entropy")
    assert row["attn_step/L2/score_max"] == values[1, 2, sm].max().item()  # max over heads
    assert row["attn_step/score_max"] == values[1, :, sm].max().item()  # max over layers
    assert row["attn_step/L0/entropy"] == pytest.approx(values[1, 0, ent].mean().item())
    assert row["attn_step/entropy"] == pytest.approx(values[1, :, ent].mean().item())
    assert row["attn_step/L1/H1/saturated_frac"] == values[1, 1, STATS.index("saturated_frac"), 1].item()
    assert len(row) == len(STATS) * (1 + 3 + 3 * 2)
    assert all(K.is_known(key) for key in row), [key for key in row if not K.is_known(key)]
    assert set(attn_stats.KEYS.values()) <= set(K.MEANINGS)
    assert not any("/H" in key for key in attn_stats.metric_rows(values, per_head=False)[0])


# ---------------------------------------------------------------- settings and the loop (CPU)

STATS_RUN = ("model.n_layer=2", "train.max_steps=6", "train.eval_every=0", "train.log_every=4", "train.device=cpu",
             "train.sample_tokens=2")


def test_settings_default_off_and_bad_values_are_one_line():
    assert compose_tiny(*STATS_RUN).train.attn_stats == "off"
    validate(compose_tiny(*STATS_RUN, "train.attn_stats=every", "train.attn_stats_every=3",
                          "train.attn_stats_per_head=true"))
    validate(compose_tiny(*STATS_RUN, "train.attn_stats=false"))  # YAML's bare `off`
    with pytest.raises(ConfigError, match=r"^train.attn_stats must be one of every, off; got 'sometimes'$"):
        validate(compose_tiny(*STATS_RUN, "train.attn_stats=sometimes"))
    with pytest.raises(ConfigError, match=r"^train.attn_stats_every must be an integer >= 1; got 0$"):
        validate(compose_tiny(*STATS_RUN, "train.attn_stats_every=0"))
    with pytest.raises(ConfigError, match=r"^train.attn_stats_pass must be one of auto, fused, separate"):
        validate(compose_tiny(*STATS_RUN, "train.attn_stats_pass=both"))


def test_the_pass_is_fused_at_every_step_and_separate_with_a_cadence():
    assert compose_tiny(*STATS_RUN).train.attn_stats_pass == "auto"
    passes = {(asked, every): validate(compose_tiny(*STATS_RUN, "train.attn_stats=every",
                                                    f"train.attn_stats_pass={asked}",
                                                    f"train.attn_stats_every={every}")).train.stats_pass
              for asked in ("auto", "fused", "separate") for every in (1, 2, 10)}
    assert [passes["auto", every] for every in (1, 2, 10)] == ["fused", "separate", "separate"]
    assert passes["fused", 10] == "fused" and passes["separate", 1] == "separate"
    for every in (1, 3):  # off CUDA no layer takes the fused pass, whatever was asked
        settings = validate(compose_tiny(*STATS_RUN, "train.attn_stats=every", f"train.attn_stats_every={every}"))
        model = tiny_model()
        stats = attn_stats.from_config(settings.train, model)
        assert stats.every == every
        assert all(block.attn.stats.fused_pass is False for block in model.blocks)  # a CPU model: the separate pass
        assert all(block.attn.stats.cudnn_backward is False for block in model.blocks)


@pytest.mark.parametrize("typed, read", [("off", "off"), ('"off"', "off"), ("false", "off"), ("every", "every"),
                                         ("on", "every"), ("true", "every")])
def test_a_bare_or_quoted_yaml_value_reads_the_same(tmp_path, typed, read):
    """YAML reads a bare off as false and on as true: the settings hold every | off however it was written."""
    from omegaconf import OmegaConf

    cfg = compose_tiny(*STATS_RUN)
    cfg.train = OmegaConf.merge(cfg.train, OmegaConf.create(f"attn_stats: {typed}\n"))
    assert validate(cfg).train.attn_stats == read
    model = tiny_model()
    assert (attn_stats.from_config(validate(cfg).train, model) is attn_stats.OFF) == (read == "off")


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


@pytest.mark.parametrize("every", [1, 2])
def test_the_loop_logs_the_statistics_of_due_steps(tmp_path, every):
    from andrea_exp.training.loop import train

    cfg = compose_tiny(*STATS_RUN, "train.attn_stats=every", f"train.attn_stats_every={every}")
    train(validate(cfg), tmp_path)
    rows = [r for r in read_rows(tmp_path) if K.TRAIN_LOSS in r]
    assert [r["step"] for r in rows] == list(range(6))
    logged = [r["step"] for r in rows if K.ATTN_STEP_ENTROPY in r]
    assert logged == list(range(0, 6, every))
    for r in rows:
        if r["step"] in logged:
            keys = [key for key in r if key.startswith("attn_step/")]
            assert len(keys) == len(STATS) * (1 + 2) and all(K.is_known(key) for key in keys)
            assert 0 < r[K.ATTN_STEP_ENTROPY] <= math.log(16) and 0 < r[K.ATTN_STEP_MAX_PROB] <= 1
            assert math.isfinite(r[K.ATTN_STEP_SCORE_MAX])


def test_the_loop_logs_no_statistics_when_off(tmp_path):
    from andrea_exp.training.loop import train

    train(validate(compose_tiny(*STATS_RUN)), tmp_path)
    assert not any(key.startswith("attn_step/") for r in read_rows(tmp_path) for key in r)


def train_steps(cfg, steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Each step's loss and the final parameters of `steps` steps of the step train() builds, the statistics
    handled as the loop handles them (before_step / after_step, flush at train.log_every)."""
    from andrea_exp.training.cell import build_cell

    cell = build_cell(validate(cfg))  # as train() builds them
    losses = []
    for i in range(steps):
        x, y = cell.data.batch(i, cfg.train.batch_size, cfg.seed)
        cell.stats.before_step(i)
        loss, _, _ = cell.step(x, y)
        cell.stats.after_step(i)
        losses.append(loss.item())
        if (i + 1) % cfg.train.log_every == 0:
            cell.stats.flush()
    return losses, {name: p.detach().clone() for name, p in cell.model.named_parameters()}


def assert_same_training(*overrides: str, steps: int = 6) -> None:
    """attn_stats=off and =every from one seed: bitwise the same losses at every step and the same weights."""
    fast = ["train.lr=1e-2", "train.warmup_steps=0"]  # full steps from the first: a changed forward would show
    off = train_steps(compose_tiny(*STATS_RUN, *fast, *overrides, "train.attn_stats=off"), steps)
    every = train_steps(compose_tiny(*STATS_RUN, *fast, *overrides, "train.attn_stats=every"), steps)
    assert off[0] == every[0], f"losses off {off[0]} vs every {every[0]}"
    assert off[0][0] != off[0][-1]  # it trained
    for name, weight in off[1].items():
        assert torch.equal(weight, every[1][name]), name


@pytest.mark.parametrize("overrides", [[], ["train.precision=bf16"], ["model.attn_impl=explicit"],
                                       ["model.attn_impl=bilinear", "model.d_k=128"],
                                       ["model.qk_layernorm=true", "train.precision=bf16"],
                                       ["train.attn_stats_every=2"]],
                         ids=["fused", "bf16", "explicit", "bilinear", "qk_layernorm-bf16", "every-2nd"])
def test_the_statistics_leave_training_bitwise_unchanged(overrides):
    assert_same_training(*overrides)


@pytest.fixture
def one_thread_fresh_compiler():
    """Compiled CPU kernels reduce over threads with atomics (a compiled arm differs from itself at 1e-7 over a
    few steps with 2 threads); one thread makes a compiled step reproducible bit for bit. Dynamo's cache is
    cleared so no graph compiled under another thread count is reused."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.compiler.reset()
    yield
    torch.compiler.reset()
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_compiled_training_is_bitwise_unchanged_by_the_statistics(one_thread_fresh_compiler, precision):
    assert_same_training("train.compile=true", f"train.precision={precision}", steps=5)


# ---------------------------------------------------------------- the Triton kernels (GPU; or Triton's interpreter)


def kernel_grid():
    for param in grid():
        T, d, causal, scaled, fill, dtype = param.values
        if kernel_device() == "cpu" and (dtype == torch.bfloat16 or T == 1024):
            continue  # the interpreter: no bf16, and T 1024 takes minutes
        yield pytest.param(*param.values, id=param.id, marks=kernel_gpu)


@pytest.mark.parametrize("T, d, causal, scaled, fill, dtype", list(kernel_grid()))
def test_kernel_equals_the_explicit_pipeline(T, d, causal, scaled, fill, dtype):
    check_against_explicit(T, d, causal, scaled, fill, dtype, "triton", kernel_device())


@kernel_gpu
def test_kernel_fails_if_the_mask_is_ignored_and_equals_the_torch_path():
    device = kernel_device()
    q, k = (t.to(device) for t in rising_keys())
    got = head_stats(q, k, scale=1.0, causal=True, impl="triton")
    assert_close(got, reference_head_stats(q, k, scale=1.0, causal=True), q.size(2))
    with pytest.raises(AssertionError):
        assert_close(got, reference_head_stats(q, k, scale=1.0, causal=False), q.size(2))
    q, k = random_qk(300, 64, device=device)
    assert_close(head_stats(q, k, scale=0.125, causal=True, impl="triton"), head_stats_torch(q, k, 0.125, True), 600)


@kernel_gpu
def test_kernel_takes_strided_and_expanded_operands_and_one_hot_rows():
    device = kernel_device()
    q, k = random_qk(130, 32, device=device)
    k_heads_first = k.transpose(0, 1).contiguous().transpose(0, 1)  # (B, H, T, d) view of an (H, B, T, d) tensor
    k_expanded = k[:, :1].expand_as(k)  # stride 0 over heads, as the bilinear path's right operand
    for kk in (k_heads_first, k_expanded):
        assert_close(head_stats(q, kk, scale=0.2, causal=True, impl="triton"),
                     reference_head_stats(q, kk.contiguous(), scale=0.2, causal=True), 260)
    keys = (torch.eye(17, 32) * 40.0)[None, None].to(device)
    for dtype in (torch.float32, torch.bfloat16) if device == "cuda" else (torch.float32,):
        one_hot = keys.to(dtype)
        got = dict(zip(STATS, head_stats(one_hot, one_hot, scale=1.0, causal=True, impl="triton")[:, 0].tolist()))
        assert got["entropy"] == pytest.approx(0.0, abs=1e-6) and got["max_prob"] == pytest.approx(1.0)
        uniform = dict(zip(STATS, head_stats(torch.zeros_like(one_hot), one_hot, scale=1.0, causal=False,
                                             impl="triton")[:, 0].tolist()))
        assert uniform["entropy"] == pytest.approx(math.log(17), rel=1e-6)
        assert uniform["entropy_norm"] == pytest.approx(1.0, rel=1e-6)
        assert uniform["max_prob_max"] == pytest.approx(1 / 17, rel=1e-6)


@kernel_gpu
def test_the_flag_turns_the_kernels_off():
    device = kernel_device()
    q, k = random_qk(64, 16, device=device)
    from andrea_exp.model.step_stats_kernel import head_stats_triton

    for T in (64, 1):  # T 1 also fills nan into entropy_norm and max_prob_max, on the device
        flag = torch.zeros(1, dtype=torch.int32, device=device)
        out = torch.full((len(STATS), 3), 123.0, device=device)
        head_stats_triton(q[:, :, :T], k[:, :, :T], flag, 0.25, True, 0.99, out=out)
        assert (out == 123.0).all()  # off: nothing written
        flag.fill_(1)
        head_stats_triton(q[:, :, :T], k[:, :, :T], flag, 0.25, True, 0.99, out=out)
        assert_close(out, head_stats_torch(q[:, :, :T], k[:, :, :T], 0.25, True), 2 * T)


@pytest.mark.parametrize("case, dtype", [
    pytest.param(case, dtype, id=f"{case}-{str(dtype).split('.')[-1]}",
                 marks=triton_gpu if dtype == torch.bfloat16 else kernel_gpu) for case, dtype in ADVERSARIAL])
def test_kernel_max_probability_never_exceeds_one_on_adversarial_inputs(case, dtype):
    """The kernel's row max is kept on the raw q.k and z = (r - m) c, so the max key contributes exactly 1 (with
    s = r c and z = s - m, the compiler's fused multiply-add made the max key's z the rounding error of r c and
    rows of logits in the thousands reported max_prob 1.00008; see step_stats_kernel's docstring)."""
    q, k, scale = adversarial_qk(case, dtype, kernel_device())
    for causal in (True, False):
        got = head_stats(q, k, scale=scale, causal=causal, impl="triton")
        assert_probabilities(got.cpu(), f"{case} {dtype} causal {causal}")
        ref = head_stats_torch(q, k, scale, causal)
        assert_close(got, ref, q.size(0) * q.size(2), where=f"{case} {dtype} causal {causal}")
        if case == "one-hot":
            assert (got[STATS.index("max_prob_max")] == 1.0).all()


# ---------------------------------------------------------------- the fused pass: attention and statistics (GPU)


def fused_pass(q, k, v, scale: float, causal: bool, on: int = 1, cudnn: bool = False):
    flag = torch.full((1,), on, dtype=torch.int32, device=q.device)
    return torch.ops.andrea_exp.attn_fwd_stats(q, k, v, flag, scale, causal, SATURATION, cudnn)


def explicit_float64(q, k, v, scale: float, causal: bool):
    """(softmax(mask(q k^T scale)) v, log-sum-exp of each row) in float64, the (T, T) scores written out."""
    T = q.size(-2)
    scores = q.double() @ k.double().transpose(-2, -1) * scale  # (B, H, T, T)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    return torch.softmax(scores, -1) @ v.double(), torch.logsumexp(scores, -1)


def fused_grid():
    for T in (1, 2, 17, 128, 1024):
        for d in (16, 64, 128):
            for causal in (True, False):
                for scaled in (True, False):
                    for dtype in (torch.bfloat16, torch.float16):
                        for backward in ("flash", "cudnn") if T % 64 == 0 else ("flash",):  # cudnn_backward_fits
                            yield pytest.param(T, d, causal, scaled, dtype, backward, marks=triton_gpu,
                                               id=f"T{T}-d{d}-{'causal' if causal else 'full'}-"
                                                  f"{'scaled' if scaled else 'unscaled'}-{str(dtype).split('.')[-1]}"
                                                  f"-{backward}")


@pytest.mark.parametrize("T, d, causal, scaled, dtype, backward", list(fused_grid()))
def test_the_fused_pass_attends_as_sdpa_and_reads_the_explicit_statistics(T, d, causal, scaled, dtype, backward):
    """Output and gradients (through flash's or cuDNN's backward): no further from the float64 formula than SDPA's
    flash kernel is (3 x its error plus a quarter of the dtype's epsilon, relative to the largest value);
    log-sum-exp to float32 rounding; statistics to REL, as the statistics-only pass."""
    from torch.nn import functional as F

    gen = torch.Generator(device="cuda").manual_seed(T * 1000 + d)
    B, H = (1, 2) if T >= 1024 else (2, 3)
    q, k, v = (torch.randn(B, H, T, d, device="cuda", generator=gen).to(dtype).requires_grad_() for _ in range(3))
    grad = torch.randn(B, H, T, d, device="cuda", generator=gen).to(dtype)
    scale = 1 / math.sqrt(d) if scaled else 1.0
    out, lse, stats = fused_pass(q, k, v, scale, causal, cudnn=backward == "cudnn")
    exact, exact_lse = explicit_float64(q, k, v, scale, causal)
    where = f"T {T} d {d} causal {causal} scaled {scaled} {dtype}"
    eps = torch.finfo(dtype).eps
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    def err(a, b):
        return (a.double() - b).abs().max().item()

    size = exact.abs().max().item()
    assert err(out, exact) <= 3 * err(sdpa, exact) + eps / 4 * size, where
    assert torch.allclose(lse.double(), exact_lse, rtol=1e-5, atol=1e-5), where
    assert_close(stats, reference_head_stats(q.detach().double(), k.detach().double(), scale=scale, causal=causal),
                 B * T, where=where)
    exact_grads = torch.autograd.grad(exact, (q, k, v), grad.double())
    for name, ours, theirs, ref in zip("qkv", torch.autograd.grad(out, (q, k, v), grad),
                                       torch.autograd.grad(sdpa, (q, k, v), grad), exact_grads):
        size = ref.abs().max().item()
        assert err(ours, ref) <= 3 * err(theirs, ref) + eps / 4 * size, f"{where} grad {name}"


@triton_gpu
def test_the_fused_pass_fails_if_the_mask_is_ignored_and_attends_with_the_flag_off():
    q, k = (t.to("cuda", torch.bfloat16) for t in rising_keys())
    v = torch.randn_like(q)
    out, _, stats = fused_pass(q, k, v, 1.0, True)
    assert_close(stats, reference_head_stats(q.float(), k.float(), scale=1.0, causal=True), q.size(2))
    with pytest.raises(AssertionError):
        assert_close(stats, reference_head_stats(q.float(), k.float(), scale=1.0, causal=False), q.size(2))
    causal_ref, _ = explicit_float64(q, k, v, 1.0, True)
    full_ref, _ = explicit_float64(q, k, v, 1.0, False)
    assert (out.double() - causal_ref).abs().max() < 0.02 < (out.double() - full_ref).abs().max()
    off, _, _ = fused_pass(q, k, v, 1.0, True, on=0)
    assert torch.equal(off, out)  # the flag turns the statistics off, never the attention


@triton_gpu
def test_fused_training_takes_the_fused_kernel_and_trains_as_the_separate_pass():
    """Same seed, same batches: train.attn_stats_pass=fused (the attention from the fused kernel, gradients from
    flash's backward) and =separate (SDPA's forward, a statistics-only pass) give the same losses and statistics
    to bf16 rounding; only the fused model runs _attn_fwd_stats."""
    runs = {}
    for name in ("fused", "separate"):
        cfg = compose_tiny(*GPU_RUN, "train.cuda_graph=false", f"train.attn_stats_pass={name}")
        from andrea_exp.training.cell import build_cell

        cell = build_cell(validate(cfg))
        data, model, step, stats = cell.data, cell.model, cell.step, cell.stats
        losses, recorded, kernels = [], [], set()
        for i in range(6):
            x, y = data.batch(i, cfg.train.batch_size, cfg.seed, 0, 1)
            stats.before_step(i)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                loss, _, _ = step(x, y)
                torch.cuda.synchronize()
            kernels |= {event.key for event in prof.key_averages()}
            stats.after_step(i)
            losses.append(loss.item())
            recorded.append(torch.stack([b.attn.stats.values.clone() for b in model.blocks]))
        runs[name] = losses, recorded, any("_attn_fwd_stats" in key for key in kernels)
    assert runs["fused"][2] and not runs["separate"][2]
    assert runs["fused"][0] == pytest.approx(runs["separate"][0], abs=2e-2)
    for i, (a, b) in enumerate(zip(runs["fused"][1], runs["separate"][1])):
        for li in range(len(a)):
            assert_close(a[li], b[li], 8 * 64, rel=BF16_REL, saturated_rows=4, saturated_share=0.01,
                         where=f"step {i} layer {li}")


# ---------------------------------------------------------------- a real training step on the GPU

GPU_RUN = ("model.d_model=64", "model.n_layer=2", "model.block_size=64", "data.seq_len=64", "data.train_sequences=256",
           "train.max_steps=40", "train.precision=bf16", "train.attn_stats=every")



def stats_of_steps(cfg, steps: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(each step's recorded statistics, each step's reference from the explicit pipeline on the weights and
    batch the step's forward saw) for `steps` steps of the step train() builds."""
    from andrea_exp.training.cell import build_cell

    cell = build_cell(validate(cfg))  # as train() builds them
    data, model, step, stats = cell.data, cell.model, cell.step, cell.stats
    got, ref = [], []
    for i in range(steps):
        x, y = data.batch(i, cfg.train.batch_size, cfg.seed, 0, 1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ref.append(captured_reference(model, x.contiguous()))  # before the step changes the weights
        model.train()
        stats.before_step(i)
        step(x, y)
        stats.after_step(i)
        got.append(torch.stack([b.attn.stats.values.clone() for b in model.blocks]))
    return got, ref


@triton_gpu
@pytest.mark.parametrize("mode", ["eager", "graphed", "graphed-compiled"])
def test_training_steps_record_the_explicit_pipelines_values(mode):
    overrides = {"eager": ["train.cuda_graph=false"], "graphed": ["train.cuda_graph=true"],
                 "graphed-compiled": ["train.cuda_graph=true", "train.compile=true"]}[mode]
    cfg = compose_tiny(*GPU_RUN, *overrides, "train.attn_stats_every=2")
    got, ref = stats_of_steps(cfg, 10)
    for i in range(0, 10, 2):  # the due steps; the graph's replays after its capture included
        for li in range(len(got[i])):
            assert_close(got[i][li], ref[i][li], 8 * 64, rel=BF16_REL, saturated_rows=4, saturated_share=0.01,
                         where=f"{mode} step {i} layer {li}")
