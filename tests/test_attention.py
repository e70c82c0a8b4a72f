"""The attention pipeline: the explicit path against hand computations, and against the fused kernels."""

from __future__ import annotations

import math

import pytest
import torch

from andrea_exp.config.variants import normalize_mask_fill, normalize_scale
from andrea_exp.model.attention import (
    absent_keys,
    attention,
    check_sdpa_backend,
    explicit_attention,
    fused_attention,
    future_mask,
    prefer_fused,
    scale_factor,
    sdpa_context,
)

SCALES = ("sqrt", "none", "inv", True, False)
# (d_k, d_v): every d_k of the brief, some with d_v != d_k
DIMS = ((8, 8), (8, 24), (64, 64), (64, 16), (256, 256), (256, 40), (512, 512), (512, 32))

# float32 tolerances. Both paths sum d_k products per score and T probabilities x values per output
# in a different order; the rounding error of such a sum is at most ~n * eps * sum|terms| with
# eps = 1.2e-7 and n <= 512, and in practice ~sqrt(n) * eps. Observed over this grid: outputs differ
# by at most 1.1e-6, gradients (entries up to ~10, each a sum over T x d_v more terms) by 2e-5.
# The tolerances sit 5-20x above that and far below any real difference (a wrong scale or a
# shifted mask moves outputs and gradients by O(0.1)).
RTOL, ATOL = 1e-4, 2e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-4


def qkv(d_k: int, d_v: int, *, scale, B=2, H=3, T=16, seed=0, dtype=torch.float64):
    """Random q, k, v whose scaled scores have std ~1, so the softmax is not saturated.

    With N(0, 1) components q.k has std sqrt(d_k): fine for "sqrt" (std 1) and "inv" (std
    1/sqrt(d_k)), but for "none" at d_k 512 the scores would have std ~22 and every row would be
    one-hot, where gradients vanish and a comparison says little. For "none" q and k are therefore
    drawn with std d_k**-0.25, which makes q.k std 1 as well.
    """
    gen = torch.Generator().manual_seed(seed)
    std = d_k ** -0.25 if normalize_scale(scale) == "none" else 1.0
    q = torch.randn(B, H, T, d_k, generator=gen, dtype=dtype) * std
    k = torch.randn(B, H, T, d_k, generator=gen, dtype=dtype) * std
    v = torch.randn(B, H, T, d_v, generator=gen, dtype=dtype)
    return q, k, v


def naive_attention(q, k, v, factor: float, causal: bool):
    """Loops over every (batch, head, query) in float64: the textbook formula, nothing shared with the module."""
    B, H, T, _ = q.shape
    out = torch.zeros(B, H, T, v.size(-1), dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                keys = range(i + 1) if causal else range(T)
                s = torch.stack([(q[b, h, i].double() * k[b, h, j].double()).sum() * factor for j in keys])
                p = torch.exp(s - s.max())
                p = p / p.sum()
                out[b, h, i] = sum(p[n] * v[b, h, j].double() for n, j in enumerate(keys))
    return out


def run_with_grads(fn, q, k, v, upstream):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    (out * upstream).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("d_k,d_v", DIMS)
def test_explicit_and_fused_agree_with_gradients(d_k, d_v, scale, causal):
    q, k, v = qkv(d_k, d_v, scale=scale, dtype=torch.float32)
    upstream = torch.randn(q.size(0), q.size(1), q.size(2), d_v, generator=torch.Generator().manual_seed(1))
    factor = scale_factor(scale, d_k)
    explicit = run_with_grads(lambda a, b, c: explicit_attention(a, b, c, scale=factor, causal=causal)[0],
                              q, k, v, upstream)
    fused = run_with_grads(lambda a, b, c: fused_attention(a, b, c, scale=factor, causal=causal), q, k, v, upstream)
    for name, e, f in zip(("out", "dq", "dk", "dv"), explicit, fused):
        assert e.shape == f.shape, name
        rtol, atol = (RTOL, ATOL) if name == "out" else (GRAD_RTOL, GRAD_ATOL)
        torch.testing.assert_close(e, f, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")
    # the public entry forced onto each path gives the same numbers
    pub_e = attention(q, k, v, scale=scale, causal=causal, impl="explicit")
    pub_f = attention(q, k, v, scale=scale, causal=causal, impl="fused")
    torch.testing.assert_close(pub_e, explicit[0], rtol=0, atol=0)
    torch.testing.assert_close(pub_f, fused[0], rtol=0, atol=0)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("causal", [True, False])
def test_explicit_matches_naive_loops(scale, causal):
    """Both paths against a float64 loop that shares no code with them (small sizes)."""
    d_k, d_v = 12, 5
    q, k, v = qkv(d_k, d_v, scale=scale, B=1, H=2, T=6, seed=3)
    expected = naive_attention(q, k, v, scale_factor(scale, d_k), causal)
    for impl in ("explicit", "fused"):
        got = attention(q, k, v, scale=scale, causal=causal, impl=impl)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_saturated_unscaled_scores_still_agree():
    """d_k 512, scale none, N(0, 1) q and k: scores of std ~22, nearly one-hot rows. The outputs
    still agree; the tolerance is the float32 one times the score magnitude (~60) over sqrt(d_k)."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 16, 512, generator=gen) for _ in range(3))
    e = attention(q, k, v, scale="none", impl="explicit")
    f = attention(q, k, v, scale="none", impl="fused")
    _, probs = attention(q, k, v, scale="none", return_probs=True)
    assert probs.max(-1).values.mean() > 0.95  # the case is really saturated
    torch.testing.assert_close(e, f, rtol=1e-4, atol=2e-4)


def test_fewer_queries_than_keys_masks_bottom_right_on_both_paths():
    """Queries are the last t_q positions: query i may see keys 0 .. t_k - t_q + i on both paths."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 3, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(1, 2, 5, 4, generator=gen, dtype=torch.float64)
    full = torch.cat([torch.randn(1, 2, 2, 8, generator=gen, dtype=torch.float64), q], dim=2)  # (1, 2, 5, 8)
    # the last 3 rows of a square causal attention whose last 3 queries are q
    expected = naive_attention(full, k, v, 1 / math.sqrt(8), causal=True)[:, :, 2:]
    for impl in ("explicit", "fused"):
        torch.testing.assert_close(attention(q, k, v, impl=impl), expected, rtol=1e-10, atol=1e-12)


def test_future_mask_by_hand():
    assert future_mask(3, 3).tolist() == [[False, True, True], [False, False, True], [False, False, False]]
    assert future_mask(2, 4).tolist() == [[False, False, False, True], [False, False, False, False]]


def test_causal_probabilities_are_lower_triangular_rows_sum_to_one():
    q, k, v = qkv(16, 16, scale="sqrt", B=2, H=2, T=9, dtype=torch.float32)
    _, probs = attention(q, k, v, causal=True, return_probs=True)  # (B, H, T, T)
    T = probs.size(-1)
    upper = torch.ones(T, T, dtype=torch.bool).triu(1)
    assert torch.all(probs[..., upper] == 0)
    assert torch.all(probs[..., ~upper] > 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 2, T), rtol=0, atol=1e-6)
    one_hot = torch.zeros(T)
    one_hot[0] = 1
    assert torch.equal(probs[..., 0, :], one_hot.expand(2, 2, T))  # row 0 sees only itself
    _, full = attention(q, k, v, causal=False, return_probs=True)
    assert torch.all(full[..., upper] > 0)  # without the mask the future gets weight


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_mask_fill_minus_inf_and_minus_1e9_agree_on_finite_scores(dtype):
    q, k, v = (t.to(dtype) for t in qkv(16, 8, scale="sqrt", T=7, dtype=torch.float32))
    out_inf, p_inf = attention(q, k, v, mask_fill=float("-inf"), return_probs=True)
    out_big, p_big = attention(q, k, v, mask_fill=-1e9, return_probs=True)
    assert torch.equal(p_inf, p_big)
    assert torch.equal(out_inf, out_big)
    out_str = attention(q, k, v, mask_fill="-1e9")
    assert torch.equal(out_str, out_big)


def test_three_by_three_by_hand():
    """softmax(mask(q k^T / sqrt(d_k))) v for T 3, d_k 2, d_v 2, every number from the formula."""
    q = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    k = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    v = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]], dtype=torch.float64)
    s = 1 / math.sqrt(2)
    # q k^T = [[2, 0, 1], [0, 2, -2], [2, 1, 0]]; scaled by 1/sqrt(2); the future (j > i) masked
    # row 0: only key 0 -> p = [1, 0, 0], out = v0 = [1, 0]
    # row 1: scores [0, 2s] -> p = [1, e^{2s}] / (1 + e^{2s})
    e2s = math.exp(2 * s)
    p1 = [1 / (1 + e2s), e2s / (1 + e2s), 0.0]
    # row 2: scores [2s, s, 0] -> p = [e^{2s}, e^{s}, 1] / (e^{2s} + e^{s} + 1)
    es = math.exp(s)
    z = e2s + es + 1
    p2 = [e2s / z, es / z, 1 / z]
    expected_p = torch.tensor([[1.0, 0.0, 0.0], p1, p2], dtype=torch.float64)
    expected_out = torch.tensor([
        [1.0, 0.0],
        [p1[0] * 1 + p1[1] * 0, p1[0] * 0 + p1[1] * 1],
        [p2[0] * 1 + p2[1] * 0 + p2[2] * 2, p2[0] * 0 + p2[1] * 1 + p2[2] * 2],
    ], dtype=torch.float64)
    out, probs = attention(q[None, None], k[None, None], v[None, None], scale="sqrt", causal=True, return_probs=True)
    torch.testing.assert_close(probs[0, 0], expected_p, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[0, 0], expected_out, rtol=1e-12, atol=1e-12)
    # the stages the probes read: scores scaled and masked, then the pattern
    stages: dict = {}
    explicit_attention(q[None, None], k[None, None], v[None, None], scale=s, causal=True, stages=stages)
    inf = float("-inf")
    expected_scores = torch.tensor([[2 * s, inf, inf], [0.0, 2 * s, inf], [2 * s, s, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(stages["scores"][0, 0], expected_scores, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stages["pattern"][0, 0], expected_p, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("alias,factor", [
    ("sqrt", 1 / math.sqrt(16)), ("none", 1.0), ("inv", 1 / 16), (True, 1 / math.sqrt(16)), (False, 1.0),
    ("true", 1 / math.sqrt(16)), ("false", 1.0), ("on", 1 / math.sqrt(16)), ("off", 1.0), (" SQRT ", 0.25),
])
def test_scale_aliases(alias, factor):
    assert scale_factor(alias, 16) == pytest.approx(factor, rel=1e-15)
    q, k, v = qkv(16, 4, scale="sqrt", B=1, H=1, T=5, dtype=torch.float64)
    expected = naive_attention(q, k, v, factor, causal=True)
    torch.testing.assert_close(attention(q, k, v, scale=alias), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bad", ["sqrtt", "", "1/d", None, 1, 0.5, "yes"])
def test_bad_scale_raises_naming_the_setting(bad):
    with pytest.raises(ValueError, match=r"model\.scale must be one of sqrt, none, inv, true, false"):
        normalize_scale(bad)
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"model\.scale"):
        attention(q, q, q, scale=bad)


@pytest.mark.parametrize("bad", [0, -1.0, -9999.0, float("nan"), float("inf"), "big", None, "-1e3"])
def test_bad_mask_fill_raises_naming_the_setting(bad):
    with pytest.raises(ValueError, match=r"model\.mask_fill must be -inf or a finite number <= -1e4"):
        normalize_mask_fill(bad)
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"model\.mask_fill"):
        attention(q, q, q, mask_fill=bad)


@pytest.mark.parametrize("good,value", [("-inf", -math.inf), (float("-inf"), -math.inf), (-1e9, -1e9),
                                        ("-1e9", -1e9), (-1e4, -1e4)])
def test_good_mask_fill_values(good, value):
    assert normalize_mask_fill(good) == value


def test_bad_impl_raises():
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match="impl must be one of auto, explicit, fused"):
        attention(q, q, q, impl="flash")



@pytest.mark.parametrize("scale", ["none", "inv"])
def test_fewer_queries_than_keys_keeps_a_non_default_scale_on_both_paths(scale):
    """The bottom-right mask branch must pass the setting's scale, not SDPA's default 1/sqrt(d_k)."""
    gen = torch.Generator().manual_seed(3)
    full_q, k, v = (torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    expected = naive_attention(full_q, k, v, scale_factor(scale, 8), causal=True)[:, :, 2:]  # last 3 queries
    for impl in ("explicit", "fused"):
        got = attention(full_q[:, :, 2:], k, v, scale=scale, impl=impl)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_fewer_queries_than_keys_without_the_mask_sees_every_key():
    gen = torch.Generator().manual_seed(4)
    full_q, k, v = (torch.randn(1, 2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    expected = naive_attention(full_q, k, v, 1 / math.sqrt(8), causal=False)[:, :, 2:]
    for impl in ("explicit", "fused"):
        got = attention(full_q[:, :, 2:], k, v, causal=False, impl=impl)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_masks_are_built_on_the_inputs_device():
    """A mask left on the CPU breaks GPU runs; the meta device shows it without a GPU."""
    assert future_mask(2, 3, device="meta").device.type == "meta"
    q = torch.empty(1, 2, 4, 8, device="meta")
    out, pattern = explicit_attention(q, q, q, scale=0.5, causal=True)
    assert out.device.type == pattern.device.type == "meta"
    assert fused_attention(q[:, :, 1:], q, q, scale=0.5, causal=True).device.type == "meta"


def test_stages_keep_the_scores_gradient():
    """Probes read d loss / d scores from stages["scores"].grad after backward."""
    q, k, v = (t.requires_grad_(True) for t in qkv(4, 4, scale="sqrt", B=1, H=1, T=3))
    stages = {}
    out, _ = explicit_attention(q, k, v, scale=0.5, causal=True, stages=stages)
    out.sum().backward()
    grad = stages["scores"].grad
    assert grad is not None and grad.shape == (1, 1, 3, 3)
    assert grad[0, 0, 0, 0] == 0  # a row with one visible key: softmax is flat there
    assert grad.abs().sum() > 0


@pytest.mark.parametrize("dtype,softmax_dtype", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                                 (torch.float32, torch.float32), (torch.float64, torch.float64)])
def test_softmax_runs_in_float32_at_least(dtype, softmax_dtype):
    q = torch.randn(1, 1, 4, 8).to(dtype)
    _, pattern = explicit_attention(q, q, q, scale=1.0, causal=True)
    assert pattern.dtype == softmax_dtype


def test_sdpa_backend_setting_is_checked_and_named():
    for backend in ("auto", "flash", "cudnn", "efficient", "math"):
        assert check_sdpa_backend(backend) == backend
    with pytest.raises(ValueError, match=r"^model.sdpa_backend must be one of auto, flash, cudnn, efficient, math; "
                                         r"got 'fast'$"):
        check_sdpa_backend("fast")


def test_sdpa_context_restricts_the_kernels_only_when_asked():
    flags = lambda: (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())  # noqa: E731
    before = flags()
    with sdpa_context():  # the default is "auto": no restriction
        assert flags() == before
    with sdpa_context("math"):
        assert flags() == (False, True)
    with sdpa_context("flash"):
        assert flags() == (True, False)
    assert flags() == before


def test_prefer_fused_up_to_head_dim_256_with_the_minus_inf_fill():
    assert prefer_fused(64, 64, -math.inf) and prefer_fused(256, 256, -math.inf) and prefer_fused(8, 256, -math.inf)
    assert not prefer_fused(257, 64, -math.inf) and not prefer_fused(64, 257, -math.inf)
    assert not prefer_fused(64, 64, -1e9)  # the fused kernels mask with -inf only


@pytest.mark.parametrize("shape_q,shape_v,fused", [
    ((1, 2, 3, 8), (1, 2, 3, 8), True),          # head dims 8: the fused kernels
    ((1, 300, 2, 8), (1, 300, 2, 8), True),      # many heads: the head dim decides, not the head count
    ((1, 1, 300, 8), (1, 1, 300, 8), True),      # a long sequence: nor the length
    ((1, 2, 3, 300), (1, 2, 3, 8), False),       # d_k above 256: the explicit path
    ((1, 2, 3, 8), (1, 2, 3, 300), False),       # d_v above 256: the explicit path
])
def test_auto_picks_the_path_by_head_dim(monkeypatch, shape_q, shape_v, fused):
    import andrea_exp.model.attention as module

    calls = []
    real_explicit, real_fused = module.explicit_attention, module.fused_attention
    spy = lambda name, real: lambda *a, **kw: calls.append(name) or real(*a, **kw)  # noqa: E731
    monkeypatch.setattr(module, "explicit_attention", spy("explicit", real_explicit))
    monkeypatch.setattr(module, "fused_attention", spy("fused", real_fused))
    q, v = torch.randn(shape_q), torch.randn(shape_v)
    attention(q, q, v)
    assert calls == ["fused" if fused else "explicit"]
    calls.clear()
    attention(q, q, v, mask_fill=-1e9)  # a finite fill always takes the explicit path
    assert calls == ["explicit"]


def test_a_finite_fill_reaches_the_explicit_path():
    """-1e9 is not -inf: when the visible scores are below it, the masked (future) keys take the mass.
    Scores here are all -1e10 (q = -1e5, k = 1e5, no scaling), so by hand, per query row:
    -inf fill: causal uniform rows; -1e9 fill: the masked keys win the row."""
    q = torch.full((1, 1, 3, 1), -1e5, dtype=torch.float64)
    k = torch.full((1, 1, 3, 1), 1e5, dtype=torch.float64)
    v = torch.eye(3, dtype=torch.float64).view(1, 1, 3, 3)  # out row = the probability row
    with_inf = attention(q, k, v, scale="none", mask_fill="-inf")
    with_1e9 = attention(q, k, v, scale="none", mask_fill=-1e9)
    third = 1 / 3
    torch.testing.assert_close(with_inf[0, 0], torch.tensor([[1, 0, 0], [0.5, 0.5, 0], [third] * 3],
                                                            dtype=torch.float64))
    torch.testing.assert_close(with_1e9[0, 0], torch.tensor([[0, 0.5, 0.5], [0, 0, 1], [third] * 3],
                                                            dtype=torch.float64))

def test_absent_keys_are_those_at_or_beyond_each_rows_limit():
    got = absent_keys(torch.tensor([1, 3, 4]), 4)
    assert torch.equal(got, torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]], dtype=torch.bool))


# B != H, so a limit read along the wrong dim fails; limits 1 (a single key), mid and full length
VISIBLE = torch.tensor([3, 1, 7])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mask_fill", [-math.inf, -1e9])
def test_visible_keys_make_later_keys_absent_on_both_layouts(causal, mask_fill):
    """Row b with visible_keys p: no attention mass on keys >= p, and its positions < p give what the
    formula gives on keys (and, causal, queries) 0..p-1 alone: the later keys are absent, not masked."""
    q, k, v = qkv(8, 5, scale="sqrt", B=3, H=2, T=7)
    factor = scale_factor("sqrt", 8)
    out, pattern = explicit_attention(q, k, v, scale=factor, causal=causal, mask_fill=mask_fill,
                                      visible_keys=VISIBLE)  # (B, H, T, d_v), (B, H, T, T)
    heads_first = lambda t: t.transpose(0, 1).contiguous()  # (B, H, ...) <-> (H, B, ...)
    out_hf, pattern_hf = explicit_attention(heads_first(q), heads_first(k), heads_first(v), scale=factor,
                                            causal=causal, mask_fill=mask_fill, visible_keys=VISIBLE,
                                            heads_first=True)  # (H, B, T, d_v), (H, B, T, T)
    torch.testing.assert_close(heads_first(out_hf), out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(heads_first(pattern_hf), pattern, rtol=1e-12, atol=1e-12)
    for b, p in enumerate(VISIBLE.tolist()):
        assert torch.all(pattern[b, :, :, p:] == 0), b  # exactly zero, not merely small
        torch.testing.assert_close(pattern[b].sum(-1), torch.ones(2, 7, dtype=q.dtype))  # no empty rows
        alone = naive_attention(q[b:b + 1, :, :p], k[b:b + 1, :, :p], v[b:b + 1, :, :p], factor, causal)
        torch.testing.assert_close(out[b:b + 1, :, :p], alone, rtol=1e-10, atol=1e-12)


def test_absent_keys_get_minus_inf_whatever_the_models_fill():
    """All scores -1e10: a -1e9 fill would win every row it is in (see the test above), but absent keys
    get -inf, so even then they carry no mass. Causal with fill -1e9, limit 2 of 4 keys:
    row 0 sees key 0 and masks key 1 (-1e9 wins), row 1 ties keys 0 and 1, rows 2 and 3 likewise."""
    q = torch.full((1, 1, 4, 1), -1e5, dtype=torch.float64)
    k = torch.full((1, 1, 4, 1), 1e5, dtype=torch.float64)
    v = torch.eye(4, dtype=torch.float64).view(1, 1, 4, 4)  # out row = the probability row
    out, pattern = explicit_attention(q, k, v, scale=1.0, causal=True, mask_fill=-1e9, visible_keys=torch.tensor([2]))
    assert torch.all(pattern[..., 2:] == 0)
    expected = torch.tensor([[0, 1, 0, 0], [0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(out[0, 0], expected)


@pytest.mark.parametrize("causal", [True, False])
def test_fused_visible_keys_agree_with_explicit(causal):
    q, k, v = qkv(8, 5, scale="sqrt", B=3, H=2, T=7)
    factor = scale_factor("sqrt", 8)
    explicit, _ = explicit_attention(q, k, v, scale=factor, causal=causal, visible_keys=VISIBLE)
    fused = fused_attention(q, k, v, scale=factor, causal=causal, visible_keys=VISIBLE)
    torch.testing.assert_close(fused, explicit, rtol=1e-10, atol=1e-12)
    # every key visible: the plain call (is_causal or no mask), up to the kernels' rounding
    full = torch.full((3,), 7)
    torch.testing.assert_close(fused_attention(q, k, v, scale=factor, causal=causal, visible_keys=full),
                               fused_attention(q, k, v, scale=factor, causal=causal), rtol=1e-12, atol=1e-12)
    assert torch.equal(explicit_attention(q, k, v, scale=factor, causal=causal, visible_keys=full)[0],
                       explicit_attention(q, k, v, scale=factor, causal=causal)[0])


# ---- GPU: which SDPA kernel runs at each head dim, and does it agree with the explicit path ----

BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
# bf16 has an 8-bit mantissa (eps 2^-8 = 3.9e-3). The explicit path rounds the scores and the
# probabilities to bf16 once each and the kernels keep them in float32, so outputs (convex
# combinations of N(0, 1) values) differ by a few eps: 2e-2 absolute leaves room for that and
# still catches a wrong scale or mask, which move outputs by O(0.1-1).
BF16_ATOL, BF16_RTOL = 2e-2, 2e-2
# The refusals a healthy PyTorch build makes, backend -> the largest head dim it takes: flash and cuDNN
# stop at head dim 256 (seen on an H200, torch 2.11 + cuDNN 9.19, forward and backward, B 2, H 4, T 256:
# flash and cuDNN refuse 512 and 4096 with "No available kernel", efficient and math run everything).
# Any other refusal (e.g. flash at d_k 64) is a broken kernel or build and fails the test, not a skip.
MAX_HEAD_DIM = {"FLASH_ATTENTION": 256, "CUDNN_ATTENTION": 256}


def refusal_expected(backend: str, d_k: int) -> bool:
    return d_k > MAX_HEAD_DIM.get(backend, math.inf)


def test_expected_refusals_are_only_above_the_fused_limit():
    assert [d for d in (64, 256, 512, 4096) if refusal_expected("FLASH_ATTENTION", d)] == [512, 4096]
    assert [d for d in (64, 256, 512, 4096) if refusal_expected("CUDNN_ATTENTION", d)] == [512, 4096]
    assert not any(refusal_expected(b, 4096) for b in ("EFFICIENT_ATTENTION", "MATH"))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d_k", [64, 256, 512, 4096])
def test_sdpa_backend_per_head_dim(d_k, backend, causal):
    """Force each SDPA backend in turn: the ones that run agree with the explicit path in bf16,
    output and gradients. A refusal listed in MAX_HEAD_DIM (flash, cuDNN above 256) is skipped with the
    reason; any other refusal fails."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    B, H, T = 2, 4, 256
    q, k, v = (torch.randn(B, H, T, d_k, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    upstream = torch.randn(B, H, T, d_k, device="cuda", generator=gen, dtype=torch.bfloat16)
    factor = 1 / math.sqrt(d_k)
    explicit = run_with_grads(lambda a, b, c: explicit_attention(a, b, c, scale=factor, causal=causal)[0],
                              q, k, v, upstream)
    try:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            fused = run_with_grads(lambda a, b, c: fused_attention(a, b, c, scale=factor, causal=causal),
                                   q, k, v, upstream)
            torch.cuda.synchronize()
    except RuntimeError as err:
        why = f"{backend} refuses d_k={d_k}: {str(err).splitlines()[0][:160]}"
        if not refusal_expected(backend, d_k):
            pytest.fail(f"unexpected refusal (not in MAX_HEAD_DIM): {why}")
        pytest.skip(why)
    for name, e, f in zip(("out", "dq", "dk", "dv"), explicit, fused):
        e, f = e.float(), f.float()
        # gradients scale with the upstream and with T; compare relative to their largest entry
        atol = BF16_ATOL * max(1.0, e.abs().max().item())
        torch.testing.assert_close(f, e, rtol=BF16_RTOL, atol=atol, msg=lambda m, n=name: f"{backend} {n}: {m}")
