"""The head-major GEMMs: the same products as matmul, gradients by hand, contiguous, autocast dtypes."""

from __future__ import annotations

import pytest
import torch

from andrea_exp.model.head_gemms import head_projection, qk_scores


def test_qk_scores_is_q_times_k_transposed_with_exact_gradients():
    torch.manual_seed(0)
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 6, 4, dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(qk_scores(q, k), q @ k.transpose(-2, -1))
    assert torch.autograd.gradcheck(qk_scores, (q, k))
    grad = torch.randn(2, 3, 5, 6, dtype=torch.float64)
    gq, gk = torch.autograd.grad(qk_scores(q, k), (q, k), grad)
    torch.testing.assert_close(gq, grad @ k)  # d/dq sum(G * q k^T) = G k
    torch.testing.assert_close(gk, grad.transpose(-2, -1) @ q)  # d/dk = G^T q
    assert gk.is_contiguous()  # written in k's layout, not a transposed view


def test_head_projection_is_each_heads_linear_layer():
    torch.manual_seed(0)
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)  # (H, w, C)
    out = head_projection(x, weight)  # (H, N, w)
    for h in range(3):
        torch.testing.assert_close(out[h], x @ weight[h].T)
    assert torch.autograd.gradcheck(head_projection, (x, weight))
    grad = torch.randn(3, 7, 4, dtype=torch.float64)
    gx, gw = torch.autograd.grad(head_projection(x, weight), (x, weight), grad)
    torch.testing.assert_close(gw, torch.stack([grad[h].T @ x for h in range(3)]))
    torch.testing.assert_close(gx, sum(grad[h] @ weight[h] for h in range(3)))
    assert gw.is_contiguous()


@pytest.mark.parametrize("fn,shapes", [(qk_scores, ((2, 5, 4), (2, 6, 4))), (head_projection, ((7, 5), (3, 4, 5)))])
def test_autocast_computes_in_its_dtype_and_returns_gradients_in_the_inputs(fn, shapes):
    a, b = (torch.randn(*s, requires_grad=True) for s in shapes)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fn(a, b)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert a.grad.dtype == b.grad.dtype == torch.float32
    ga, gb = torch.autograd.grad(fn(a, b).sum(), (a, b))  # float32 reference
    torch.testing.assert_close(a.grad, ga, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(b.grad, gb, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("fn,shapes", [(qk_scores, ((2, 5, 4), (2, 6, 4))), (head_projection, ((7, 5), (3, 4, 5)))])
def test_mixed_dtypes_promote_like_matmul(fn, shapes):
    a64, b32 = torch.randn(*shapes[0], dtype=torch.float64), torch.randn(*shapes[1], dtype=torch.float32)
    assert fn(a64, b32).dtype == torch.float64
    assert fn(a64.float(), b32.double()).dtype == torch.float64
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast leaves float64 alone, as it does for matmul
        assert fn(a64, b32.double()).dtype == torch.float64


@pytest.mark.parametrize("fn,shapes", [(qk_scores, ((2, 5, 4), (2, 6, 4))), (head_projection, ((7, 5), (3, 4, 5)))])
@pytest.mark.parametrize("which", [0, 1])
def test_an_input_alone_requiring_grad_gets_its_gradient(fn, shapes, which):
    inputs = [torch.randn(*s, dtype=torch.float64) for s in shapes]
    inputs[which].requires_grad_(True)
    (grad,) = torch.autograd.grad(fn(*inputs).sum(), inputs[which])
    assert grad.shape == inputs[which].shape and grad.abs().sum() > 0
