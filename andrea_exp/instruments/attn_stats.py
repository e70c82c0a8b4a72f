"""Attention statistics of the training batch at every step, without the (T, T) matrix.

The probe reads softmax peakiness on a fixed held-out batch every `probe.every` steps, through the
explicit pipeline that materialises (B, H, T, T). This module reads it on the batch being trained, inside
the training forward, from the q and k the attention itself uses (after QK-LayerNorm, in the dtype the
attention kernel sees), with the scale and the mask the model applies: per layer and head,

    score_max       the largest logit over visible entries (the signal behind QK-clip and soft-capping)
    entropy         mean row entropy (nats)
    entropy_norm    mean over rows with more than one visible key of entropy / log(visible keys)
    max_prob        mean row max-probability
    max_prob_max    largest row max-probability over rows with more than one visible key (a causal row 0
                    sees one key: with it the value would always be 1)
    saturated_frac  share of rows whose max-probability exceeds metrics.SATURATION (the probe's 0.99)

Each row's softmax is read online, key block by key block, in float32: a running max m, a running sum
l = sum_j exp(s_j - m) and a running a = sum_j exp(s_j - m) (s_j - m); when the max moves from m to m',
l and a are rescaled by exp(m - m') and a gains l (m - m'). At the row's end

    max_prob = 1 / l,    entropy = log l - a / l    (= -sum_j p_j log p_j, p_j = exp(s_j - m) / l).

Masked keys carry no mass whatever `model.mask_fill` is: with a finite fill such as -1e9 the explicit
pipeline gives them exp(-1e9 - m) = 0 in float32 too, so both agree. q k^T is accumulated in float32 from
the inputs' own values (bf16 products are exact in float32), as the fused attention kernels do; the
explicit pipeline rounds its bf16 scores to bf16 before the float32 softmax, so bf16 runs differ from it
by that rounding.

Two passes compute the same numbers (`train.attn_stats_pass`). The separate pass reads q and k after the
forward's own projections: a Triton kernel on CUDA (model/step_stats_kernel, imported only there) and a plain
PyTorch path everywhere else (CPU, or CUDA without Triton), chunked over keys so that no (T, T) block is held
for the whole batch, behind one custom op, `andrea_exp::attn_head_stats`. The fused pass
(model/attn_fwd_stats_kernel, CUDA, bf16/fp16, d_k <= 128, the fused path) is the attention's forward itself,
a flash-style Triton kernel whose online softmax also keeps a, behind `andrea_exp::attn_fwd_stats`, whose
gradients are PyTorch's cuDNN (or flash) attention backward on its output and log-sum-exp. torch.compile treats
both ops as opaque and a CUDA graph captures them as their kernels. `auto` takes the fused pass at every step
(1.6% of ANDREA-120M's throughput on an H200 against 3.0% for the separate one) and the separate pass with a
cadence (the fused forward runs on every step, due or not).

In the model: `enable(model)` gives each attention layer a (N_STATS, H) float32 buffer that the training
forward overwrites (a buffer update, like BatchNorm's running statistics: static memory for a CUDA graph, a
functionalised mutation for torch.compile) and a shared (1,) int32 flag the Triton kernel reads on the
device, so a cadence (`train.attn_stats_every`) needs no second graph: on a step that is not due the
kernels return at once and the buffer is left unread. Forwards in eval mode, under no_grad, with captured
stages (the probe) or with `visible_keys` (evaluation) do not touch it. `StepStats` reads the buffers after
each due step (one small stack on the device, no host sync) and turns the window's values into metric rows
with one host sync at the logging flush. The statistics are detached: never part of the autograd graph.

Bilinear attention (`model.attn_impl=bilinear`, large d_k): q k^T is x_i (W_q^T W_k) x_j there, and the two
operands (x W_q^T W_k, x) per head are exactly a (q, k) pair of width d_model, so the statistics are
computed from them, chunk-wise like any other q, k; q and k of width d_k are never formed.
"""

from __future__ import annotations

import math

import torch

from andrea_exp.config.schema import TrainSchema
from andrea_exp.model.step_stats import (  # noqa: F401  (the statistics themselves, computed in the forward)
    N_STATS,
    STATS,
    enable,
    head_stats,
    head_stats_torch,
    kept_rows,
    triton_available,
)
from andrea_exp.runs import metric_keys as K
from andrea_exp.runs.metric_keys import SATURATION

# pooled over heads and layers by the max (the largest logit, the peakiest row) or by the mean (the rest)
MAX_POOLED = ("score_max", "max_prob_max")
KEYS = {name: f"{K.ATTN_STEP}/{name}" for name in STATS}


def reference_head_stats(q, k, *, scale: float, causal: bool, mask_fill: float = -math.inf,
                         threshold: float = SATURATION) -> torch.Tensor:
    """The same (N_STATS, H) through the explicit pipeline (attention.explicit_attention: (B, H, T, T) scores
    and float32 softmax) and the probe's reductions (metrics.head_attention_stats): what the tests hold
    head_stats against."""
    from andrea_exp.instruments.metrics import first_kept_row, head_attention_stats
    from andrea_exp.model.attention import explicit_attention

    stages: dict = {}
    v = q.new_zeros(q.shape[:-1] + (1,))
    with torch.no_grad():
        explicit_attention(q, k, v, scale=scale, causal=causal, mask_fill=mask_fill, stages=stages)
        pattern = stages["pattern"]  # (B, H, T, T) float32
        probe = head_attention_stats(stages["scores"], pattern, causal)
        max_prob = pattern.amax(-1)  # (B, H, T)
        first = first_kept_row(q.size(-2), k.size(-2), causal)  # rows with more than one visible key
        probe["max_prob_max"] = max_prob[..., first:].amax((0, 2)) if first < q.size(-2) else \
            torch.full_like(probe["max_prob"], math.nan)
        probe["saturated_frac"] = (max_prob > threshold).float().mean((0, 2))
    return torch.stack([probe[name].float() for name in STATS])


# ---------------------------------------------------------------- in the loop


def metric_rows(values: torch.Tensor, per_head: bool) -> list[dict]:
    """(steps, L, N_STATS, H) -> one row per step: pooled `attn_step/<stat>`, per layer `attn_step/L{l}/<stat>`,
    per head `attn_step/L{l}/H{h}/<stat>` when asked. Per layer: the mean over heads (max for MAX_POOLED);
    pooled: the mean (max) over layers."""
    values = values.float().cpu()
    is_max = torch.tensor([name in MAX_POOLED for name in STATS])  # (N_STATS,)
    per_layer = torch.where(is_max, values.amax(-1), values.mean(-1))  # (steps, L, N_STATS)
    pooled = torch.where(is_max, per_layer.amax(1), per_layer.mean(1))  # (steps, N_STATS)
    n_layer, n_head = values.shape[1], values.shape[3]
    rows = []
    for at in range(values.size(0)):
        row = {}
        layer_values, pooled_values = per_layer[at].tolist(), pooled[at].tolist()
        head_values = values[at].tolist() if per_head else None
        for si, name in enumerate(STATS):
            row[KEYS[name]] = pooled_values[si]
            for li in range(n_layer):
                row[K.per_layer(KEYS[name], li)] = layer_values[li][si]
                if head_values is not None:
                    for h in range(n_head):
                        row[f"{K.ATTN_STEP}/L{li}/H{h}/{name}"] = head_values[li][si][h]
        rows.append(row)
    return rows


class StepStats:
    """The loop's side: set the flag before a step, keep the layers' values after a due one, rows at flush.

    every: statistics on steps that are multiples of it (step 0 included); per_head: also per-head keys."""

    def __init__(self, model, every: int = 1, per_head: bool = False, fused: bool = True):
        self.flag = enable(model, fused)
        self.layers = [block.attn for block in model.blocks]
        self.every, self.per_head = every, per_head
        self.window: list[tuple[int, torch.Tensor]] = []

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def before_step(self, step: int) -> None:
        if self.every > 1:  # every step: the flag stays 1, no fill at all
            self.flag.fill_(int(self.due(step)))

    def after_step(self, step: int) -> None:
        if self.due(step):
            self.window.append((step, torch.stack([attn.stats.values for attn in self.layers])))  # (L, N_STATS, H)

    def flush(self) -> dict[int, dict]:
        """step -> its attn_step/* row, for the steps since the last flush; one host sync."""
        if not self.window:
            return {}
        steps = [at for at, _ in self.window]
        rows = metric_rows(torch.stack([values for _, values in self.window]), self.per_head)
        self.window = []
        return dict(zip(steps, rows))


class Off:
    """StepStats's interface when train.attn_stats=off: nothing computed, nothing logged."""

    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def flush(self) -> dict[int, dict]:
        return {}


OFF = Off()


def from_config(train: TrainSchema, model) -> StepStats | Off:
    """The train group's statistics settings (attn_stats every | off, attn_stats_every, attn_stats_per_head, the
    resolved pass: TrainSchema.stats_pass) -> StepStats, or OFF."""
    if train.attn_stats == "off":
        return OFF
    return StepStats(model, train.attn_stats_every, train.attn_stats_per_head, train.stats_pass == "fused")
