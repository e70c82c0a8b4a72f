"""Mean cross-entropy of a linear head, computed over chunks of rows without the full logits tensor.

The plain path, ``cross_entropy(head(x).float(), targets)``, holds the (N, V) logits (N = B*T) for the
backward pass: at B 32, T 1024 and V 50304 that is 3.3 GB in bf16, 6.6 GB more in float32. Here each
chunk of rows makes its logits, its loss and, when gradients are wanted, its gradients with respect to
x and the head weight at once (softmax - one_hot is the gradient of the logits), then drops the logits.
Only d loss / d x (N, d) and d loss / d W (V, d) are kept for the backward pass, which just scales them
by the incoming gradient. The GEMMs are the plain path's three (logits, d x, d W): nothing is recomputed.

Inside a compiled model (train.compile) the loss is left out of the model's graph and runs chunk after
chunk, each chunk's softmax through one compiled function: traced into the model's graph, the loop is
unrolled and the compiler keeps every chunk's logits alive at once (3.3 GB at ANDREA-120M's B 32, T 1024),
which is what the chunks are there to avoid. The two gradient GEMMs write into their outputs directly: d x
into its rows, d W added to the float32 sum inside the GEMM on a GPU (out_dtype), so no chunk's (V, d)
share is written, converted and added apart.

Each chunk also reduces what its logits say about the output's scale (output_stats: log Z = logsumexp of a
row's logits, its mean and largest value, and the largest |logit|), and, with z_loss > 0, adds
z_loss * log Z^2 to each row's loss (Wortsman et al. 2023, "z-loss"): its gradient with respect to the
logits is 2 z_loss log Z softmax, folded into the same elementwise pass.
"""

from __future__ import annotations

import functools

import torch

# what a loss's stats hold, in order (model.decoder.Andrea.out_stats); a chunk's output_stats has sums for the means
OUTPUT_STATS = ("logz_mean", "logz_max", "logit_absmax", "logz_sq_mean")


def output_stats(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """(4,) of rows' logits (c, V) and their logsumexp (c,): sum and max of log Z, largest |logit|, sum of log Z^2.
    Sums, not means, so that chunks add up; never differentiated."""
    low, high = torch.aminmax(logits.detach())  # one pass over the logits for both ends
    lse = lse.detach()
    return torch.stack([lse.sum(), lse.max(), torch.maximum(-low, high), lse.square().sum()])


def summarise(stats: torch.Tensor, n: int) -> torch.Tensor:
    """(chunks, 4) output_stats of n rows in all -> (4,) in OUTPUT_STATS order: the sums made means, the maxima kept."""
    return torch.stack([stats[:, 0].sum() / n, stats[:, 1].amax(), stats[:, 2].amax(), stats[:, 3].sum() / n])


def chunk_step(xc, tc, weight, vocab, n: int, acc: torch.dtype, with_grad: bool, z_loss: float = 0.0):
    """One chunk of rows: (sum of its losses, its output_stats, d mean-loss / d its logits in xc's dtype, or None).
    z_loss > 0 adds z_loss * log Z^2 to each row's loss."""
    logits = (xc @ weight.t()).to(acc)  # (c, V)
    lse = torch.logsumexp(logits, dim=-1)  # (c,)
    loss = (lse - logits.gather(1, tc[:, None]).squeeze(1)).sum()
    if z_loss:
        loss = loss + z_loss * lse.square().sum()
    stats = output_stats(logits, lse)  # (4,)
    if not with_grad:
        return loss, stats, None
    # softmax - one_hot, scaled and cast in one elementwise pass: a comparison rather than scatter_add_ for
    # the one-hot, because a scatter stops the compiler fusing the pass
    hit = vocab[None, :] == tc[:, None]  # (c, V): the one-hot as a mask
    probs = (logits - lse[:, None]).exp_()  # (c, V): softmax
    if z_loss:  # d (z_loss lse^2) / d logits = 2 z_loss lse softmax
        probs.mul_((1.0 + 2.0 * z_loss * lse)[:, None])
    return loss, stats, probs.sub_(hit.to(acc)).div_(n).to(xc.dtype)  # (), (4,), (c, V)


def add_matmul(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """total += a @ b, with total wider than a and b (float32 against bf16): on a GPU in the GEMM itself
    (the bf16 case, the one tested on a GPU; any other runs the product and the addition apart)."""
    if total.is_cuda and total.dtype == torch.float32 and a.dtype == torch.bfloat16:
        torch.addmm(total, a, b, out_dtype=torch.float32, out=total)
    else:
        total += (a @ b).to(total.dtype)


@functools.cache
def compiled_chunk_step():
    return torch.compile(chunk_step, dynamic=False)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, targets, chunk_rows: int, with_grad: bool, z_loss: float = 0.0, step=chunk_step):
        n = x.size(0)
        acc = torch.promote_types(x.dtype, torch.float32)  # float32 softmax; float64 inputs stay float64
        total = torch.zeros((), dtype=acc, device=x.device)
        stats = []  # each chunk's output_stats
        grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device) if with_grad else None  # (N, d), rows contiguous
        grad_w = torch.zeros(weight.shape, dtype=acc, device=x.device) if with_grad else None  # (V, d)
        vocab = torch.arange(weight.size(0), device=x.device)  # (V,)
        with torch.autocast(device_type=x.device.type, enabled=False):  # dtypes are chosen by the caller
            for start in range(0, n, chunk_rows):
                rows = slice(start, start + chunk_rows)
                loss, chunk_stats, g = step(x[rows], targets[rows], weight, vocab, n, acc, with_grad,
                                            z_loss)  # (), (4,), (c, V)
                total = total + loss
                stats.append(chunk_stats)
                if with_grad:
                    torch.mm(g, weight, out=grad_x[rows])  # (c, d)
                    add_matmul(grad_w, g.t(), x[rows])  # (V, d)
                    del g  # the next chunk's logits can take its memory
        if with_grad:
            ctx.save_for_backward(grad_x, grad_w.to(weight.dtype))
        summary = summarise(torch.stack(stats), n)  # (4,) from (chunks, 4)
        ctx.mark_non_differentiable(summary)
        return total / n, summary

    @staticmethod
    def backward(ctx, grad_loss, _grad_summary):
        grad_x, grad_w = ctx.saved_tensors
        return (grad_x * grad_loss.to(grad_x.dtype), grad_w * grad_loss.to(grad_w.dtype),
                None, None, None, None, None)


# torch's own lazy form of torch.compiler.disable: the compiler (about a second to import) loads at the first call,
# inside a model being compiled, not at this module's import (the report and uncompiled runs never need it)
@torch._disable_dynamo
def _outside_the_graph(x, weight, targets, chunk_rows: int, with_grad: bool, z_loss: float):
    """Called from a model being compiled: the compiler stops its graph here, and the chunks run one after
    another, each chunk's softmax through the compiled chunk_step."""
    return _LinearCrossEntropy.apply(x, weight, targets, chunk_rows, with_grad, z_loss, compiled_chunk_step())


def linear_cross_entropy_with_stats(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                                    chunk_rows: int = 4096, z_loss: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean_i [CE(x_i W^T, targets_i) + z_loss * log Z_i^2], stats): the loss, and (4,) float of the logits
    (mean log Z, largest log Z, largest |logit|, mean log Z^2), not differentiable. x: (N, d), weight: (V, d),
    targets: (N,) int64.

    x and weight must share a dtype (the GEMMs run in it; the softmax runs in float32 or wider).
    """
    if chunk_rows < 1:
        raise ValueError(f"model.loss_chunk_rows must be an integer >= 1; got {chunk_rows!r}")
    if x.dtype != weight.dtype:
        raise ValueError(f"x and weight must share a dtype; got {x.dtype} and {weight.dtype}")
    with_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    if torch.compiler.is_compiling():
        return _outside_the_graph(x, weight, targets, int(chunk_rows), with_grad, float(z_loss))
    return _LinearCrossEntropy.apply(x, weight, targets, int(chunk_rows), with_grad, float(z_loss))


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int = 4096, z_loss: float = 0.0) -> torch.Tensor:
    """mean_i CE(x_i W^T, targets_i) (+ z_loss * mean_i log Z_i^2). x: (N, d), weight: (V, d), targets: (N,)
    int64 -> scalar. x and weight must share a dtype (the GEMMs run in it; the softmax in float32 or wider)."""
    return linear_cross_entropy_with_stats(x, weight, targets, chunk_rows, z_loss)[0]
