"""Fast paths give the plain path's numbers: chunked linear + cross-entropy, fused q/k/v projection,
a forced SDPA kernel. Each is checked against an independent computation, then for a few optimiser steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import probe_settings

from andrea_exp.instruments.probe import Probe
from andrea_exp.model.chunked_loss import linear_cross_entropy
from andrea_exp.model.decoder import Andrea, ModelConfig


def rows(n=23, d=6, v=11, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=dtype, requires_grad=True)
    w = torch.randn(v, d, generator=gen, dtype=dtype, requires_grad=True)
    t = torch.randint(0, v, (n,), generator=gen)
    return x, w, t


@pytest.mark.parametrize("chunk_rows", [1, 5, 23, 100])
def test_chunked_loss_and_gradients_match_cross_entropy_in_float64(chunk_rows):
    x, w, t = rows()
    plain = F.cross_entropy(x @ w.t(), t)
    gx, gw = torch.autograd.grad(plain, (x, w))
    chunked = linear_cross_entropy(x, w, t, chunk_rows)
    cx, cw = torch.autograd.grad(chunked, (x, w))
    # float64 throughout: only summation order differs, ~1e-16 relative
    torch.testing.assert_close(chunked, plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cx, gx, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(cw, gw, rtol=1e-10, atol=1e-12)


def test_chunked_loss_by_hand_on_two_rows():
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)  # logits: [1,0,0], [0,2,0]
    t = torch.tensor([0, 2])
    e = math.e
    by_hand = (-math.log(e / (e + 2)) - math.log(1 / (2 + e ** 2))) / 2
    assert linear_cross_entropy(x, w, t, 1).item() == pytest.approx(by_hand, rel=1e-12)


def test_chunked_gradient_scales_with_the_upstream_gradient():
    """Both inputs' gradients: the input's and the weight's."""
    x, w, t = rows()
    (3.0 * linear_cross_entropy(x, w, t, 4)).backward()
    gx3, gw3 = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    linear_cross_entropy(x, w, t, 4).backward()
    torch.testing.assert_close(gx3, 3.0 * x.grad, rtol=1e-12, atol=0)
    torch.testing.assert_close(gw3, 3.0 * w.grad, rtol=1e-12, atol=0)


def test_chunked_loss_without_grad_and_bad_input():
    x, w, t = rows()
    with torch.no_grad():
        loss = linear_cross_entropy(x, w, t, 4)
    assert not loss.requires_grad
    assert loss.item() == pytest.approx(F.cross_entropy(x @ w.t(), t).item(), rel=1e-12)
    with pytest.raises(ValueError, match=r"model\.loss_chunk_rows must be an integer >= 1; got 0"):
        linear_cross_entropy(x, w, t, 0)
    with pytest.raises(ValueError, match="must share a dtype"):
        linear_cross_entropy(x.float(), w, t)


def test_add_matmul_adds_the_product_to_the_float32_sum():
    from andrea_exp.model.chunked_loss import add_matmul

    a = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=torch.bfloat16)
    b = torch.tensor([[3.0, 0.0], [1.0, 4.0]], dtype=torch.bfloat16)
    total = torch.full((2, 2), 0.25)
    add_matmul(total, a, b)  # a @ b = [[5, 8], [0.5, -4]]
    torch.testing.assert_close(total, torch.tensor([[5.25, 8.25], [0.75, -3.75]]), rtol=0, atol=0)


@pytest.mark.gpu
def test_chunked_loss_in_bf16_on_the_gpu_sums_d_w_in_float32():
    """On a GPU each chunk's d W is added inside the GEMM (out_dtype float32): the sum over chunks must
    match a float64 computation from the same bf16 inputs to float32-sum accuracy, far closer than a
    sum rounded to bf16 after every chunk would be."""
    from andrea_exp.model.chunked_loss import add_matmul

    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(8, 512, 1024, device="cuda", generator=gen).bfloat16()  # 8 chunks of (V 512, c 1024)
    b = torch.randn(8, 1024, 64, device="cuda", generator=gen).bfloat16()
    total = torch.zeros(512, 64, device="cuda")
    for k in range(8):
        add_matmul(total, a[k], b[k])
    exact = torch.einsum("kvc,kcd->vd", a.double(), b.double())
    err = (total.double() - exact).abs().max().item()
    assert err < 1e-5 * exact.abs().max().item()  # a bf16 sum would be off by ~2e-3 of it
    x = torch.randn(4096, 64, device="cuda", generator=gen).bfloat16().requires_grad_()
    w = torch.randn(512, 64, device="cuda", generator=gen).bfloat16().requires_grad_()
    t = torch.randint(0, 512, (4096,), device="cuda", generator=gen)
    loss = linear_cross_entropy(x, w, t, 512)
    gx, gw = torch.autograd.grad(loss, (x, w))
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = F.cross_entropy(xd @ wd.t(), t)
    rx, rw = torch.autograd.grad(ref, (xd, wd))
    assert abs(loss.item() - ref.item()) < 1e-3
    torch.testing.assert_close(gw.double(), rw, rtol=2e-2, atol=2e-2 * rw.abs().max().item())
    torch.testing.assert_close(gx.double(), rx, rtol=2e-2, atol=2e-2 * rx.abs().max().item())


def test_in_a_compiled_model_the_loss_runs_outside_its_graph_one_chunk_at_a_time(monkeypatch):
    """Traced into the model's graph, the chunk loop would be unrolled and every chunk's logits kept at once;
    compiled, the model stops its graph at the loss and calls the compiled chunk step once per chunk. (The
    model here is compiled with the eager backend and the chunk step counted, not compiled: the same path.)"""
    from torch._dynamo.utils import counters

    from andrea_exp.model import chunked_loss

    calls = []

    def counted(*args):
        calls.append(args[0].shape[0])  # rows of the chunk
        return chunked_loss.chunk_step(*args)

    monkeypatch.setattr(chunked_loss, "compiled_chunk_step", lambda: counted)
    torch.manual_seed(0)
    model = Andrea(ModelConfig(**{**BASE, "loss_impl": "chunked", "loss_chunk_rows": 40}))
    x, y = torch.randint(0, 40, (4, 24)), torch.randint(0, 40, (4, 24))
    _, eager = model(x, y)
    eager_grads = torch.autograd.grad(eager, list(model.parameters()))
    assert calls == []  # eager: the plain loop, no compiled step
    torch._dynamo.reset()
    counters.clear()
    _, compiled = torch.compile(model, backend="eager")(x, y)
    compiled_grads = torch.autograd.grad(compiled, list(model.parameters()))
    assert calls == [40, 40, 16]  # 96 rows in chunks of 40, one call each
    assert any("_outside_the_graph" in reason for reason in counters["graph_break"])
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


BASE = dict(vocab_size=40, block_size=24, d_model=32, n_layer=2, n_head=4, d_k=8, d_v=12)
PLAIN = dict(loss_impl="plain", fused_qkv=False, sdpa_backend="auto")
FAST_PATHS = [dict(loss_impl="chunked", loss_chunk_rows=7), dict(fused_qkv=True),
              dict(sdpa_backend="math", attn_impl="fused"),
              dict(loss_impl="chunked", loss_chunk_rows=16, fused_qkv=True, sdpa_backend="math"),
              dict(attn_impl="explicit"),  # the head-major explicit path (head_gemms) against SDPA
              dict(attn_impl="bilinear")]  # q k^T as x (W_q^T W_k) x^T per head


def twin(fast: dict, **extra) -> tuple[Andrea, Andrea]:
    torch.manual_seed(0)
    plain = Andrea(ModelConfig(**BASE, **{**PLAIN, **extra}))
    other = Andrea(ModelConfig(**BASE, **{**PLAIN, **extra, **fast}))
    other.load_state_dict(plain.state_dict())
    return plain, other


def train_losses(model, steps=4, autocast=False) -> list[float]:
    gen = torch.Generator().manual_seed(1)
    opt = torch.optim.AdamW(model.param_groups(0.1), lr=3e-3)
    out = []
    for _ in range(steps):
        idx = torch.randint(0, 40, (3, 20), generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, loss = model(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(loss.item())
    return out


@pytest.mark.parametrize("fast", FAST_PATHS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_fast_paths_train_like_the_plain_path_in_float32(fast):
    plain, other = twin(fast)
    a, b = train_losses(plain), train_losses(other)
    # float32, 4 AdamW steps: observed loss differences ~1e-7; a wrong gradient moves the loss by >1e-3
    assert a == pytest.approx(b, rel=2e-6, abs=2e-6)
    # Adam divides by sqrt(v): an element whose gradient is ~0 moves by lr * m / sqrt(v), where rounding of a
    # tiny m and v shows (observed up to 1.2e-5 on one element of 4096, by CPU); an element stepped the wrong
    # way differs by ~2 lr = 6e-3, and a wrong gradient moves most elements of its tensor by ~lr
    for (name, pa), pb in zip(plain.named_parameters(), other.parameters()):
        diff = (pa - pb).abs()
        assert diff.max() < 1e-3, f"{name}: an element differs by {diff.max():.3g}"
        assert (diff > 1e-5).float().mean() <= 1e-3, f"{name}: {int((diff > 1e-5).sum())} elements differ by > 1e-5"


def test_chunked_loss_under_bf16_autocast_matches_plain():
    plain, other = twin(dict(loss_impl="chunked", loss_chunk_rows=5))
    a, b = train_losses(plain, steps=3, autocast=True), train_losses(other, steps=3, autocast=True)
    # same bf16 GEMMs, float32 softmax on both: the losses differ by summation order and by the bf16
    # rounding of d loss / d logits (eps 2^-8), well under a wrong-path difference
    assert a == pytest.approx(b, rel=2e-3)


def test_fused_qkv_keeps_parameter_names_and_shapes():
    plain, fused = twin(dict(fused_qkv=True))
    assert {k: v.shape for k, v in plain.state_dict().items()} == {k: v.shape for k, v in fused.state_dict().items()}
    x = torch.randn(2, 5, 32)
    q, k, v = fused.blocks[0].attn.project_qkv(x)
    attn = plain.blocks[0].attn
    torch.testing.assert_close(q, attn.q(x))
    torch.testing.assert_close(k, attn.k(x))
    torch.testing.assert_close(v, attn.v(x))
    assert v.shape == (2, 5, 4 * 12)  # d_v is its own width


def test_probe_metrics_are_the_same_on_fast_paths(tmp_path: Path):
    plain, fast = twin(dict(loss_impl="chunked", loss_chunk_rows=9, fused_qkv=True))
    tokens = torch.randint(0, 40, (2, 13), generator=torch.Generator().manual_seed(2))
    cfg = probe_settings(maps_heads=2, per_head=False)
    a = Probe(plain, tokens, cfg, tmp_path).measure(0)
    b = Probe(fast, tokens, cfg, tmp_path).measure(0)
    assert a.keys() == b.keys() and "grad/L0/q" in a and "grad/L1/v" in a
    for key in a:
        assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_chunked_model_returns_no_logits_with_targets_and_logits_without():
    _, fast = twin(dict(loss_impl="chunked"))
    idx = torch.randint(0, 40, (2, 6))
    logits, loss = fast(idx, idx)
    assert logits is None and loss.ndim == 0
    logits, loss = fast(idx)
    assert logits.shape == (2, 6, 40) and loss is None


@pytest.mark.parametrize("key,value,allowed", [
    ("loss_impl", "fast", "chunked, plain"),
    ("sdpa_backend", "flash2", "auto, flash, cudnn, efficient, math"),
    ("fused_qkv", "yes", "true, false"),
    ("attn_impl", "sdpa", "auto, explicit, fused, bilinear"),
])
def test_bad_settings_name_the_setting(key, value, allowed):
    with pytest.raises(ValueError, match=rf"model\.{key} must be one of {allowed}; got '{value}'"):
        Andrea(ModelConfig(**BASE, **{key: value}))


def test_bad_chunk_rows_names_the_setting():
    with pytest.raises(ValueError, match=r"model\.loss_chunk_rows must be an integer >= 1; got 0"):
        Andrea(ModelConfig(**BASE, loss_chunk_rows=0))


def test_head_major_explicit_path_trains_like_sdpa_under_bf16_autocast():
    plain, explicit = twin(dict(attn_impl="explicit"))
    a, b = train_losses(plain, autocast=True), train_losses(explicit, autocast=True)
    # bf16 GEMMs (8 bits of mantissa) in a different order: observed differences up to 2e-4 over 4 steps;
    # a gradient on the wrong rows moves the loss by far more
    assert a == pytest.approx(b, abs=2e-3)


def test_chunked_loss_in_bf16_takes_its_softmax_in_float32():
    """bf16 GEMMs, float32 softmax: the loss is the float32 cross-entropy of the bf16 logits, not a bf16 one
    (bf16 keeps ~3 significant digits: a log-sum-exp of ~3 off by ~1e-2)."""
    x, w, t = rows(n=64, d=16, v=50, dtype=torch.bfloat16)
    chunked = linear_cross_entropy(x, w, t, 16)
    assert chunked.dtype == torch.float32
    reference = F.cross_entropy((x.detach() @ w.detach().t()).float(), t)
    torch.testing.assert_close(chunked, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("needs", ["x", "w"])
def test_chunked_gradient_when_only_one_input_needs_one(needs):
    x, w, t = rows()
    x.requires_grad_(needs == "x")
    w.requires_grad_(needs == "w")
    wanted = x if needs == "x" else w
    (expected,) = torch.autograd.grad(F.cross_entropy(x @ w.t(), t), (wanted,))
    (got,) = torch.autograd.grad(linear_cross_entropy(x, w, t, 5), (wanted,))
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_chunked_loss_runs_the_logits_gemm_alone_when_no_gradient_is_wanted():
    """With gradients: three GEMMs per chunk (logits, d x, d W), nothing recomputed; under no_grad (evaluation,
    whose weights still require gradients) the logits' GEMM alone."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class GEMMs(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func.overloadpacket.__name__ in ("mm", "addmm", "bmm", "matmul")
            return func(*args, **(kwargs or {}))

    x, w, t = rows()  # 23 rows in chunks of 5: 5 chunks
    with torch.no_grad(), GEMMs() as evaluation:
        linear_cross_entropy(x, w, t, 5)
    with GEMMs() as training:
        linear_cross_entropy(x, w, t, 5)
    assert (evaluation.count, training.count) == (5, 15)
