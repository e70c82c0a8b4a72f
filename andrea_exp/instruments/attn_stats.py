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

Two implementations compute the same numbers: a Triton kernel on CUDA (attn_stats_kernel, imported only
there) and a plain PyTorch path everywhere else (CPU, or CUDA without Triton), chunked over keys so that
no (T, T) block is held for the whole batch. Both sit behind one custom op, `andrea_exp::attn_head_stats`,
which torch.compile treats as opaque and a CUDA graph captures as its kernels.

In the model: `enable(model)` gives each attention layer a (N_STATS, H) float32 buffer that the training
forward overwrites (a buffer update, like BatchNorm's running statistics: static memory for a CUDA graph, a
functionalised mutation for torch.compile) and a shared (1,) int32 flag the Triton kernel reads on the
device, so a cadence (`train.attn_stats_every`) needs no second graph: on a step that is not due the
kernels return at once and the buffer is left unread. Forwards in eval mode, under no_grad, with captured
stages (the probe) or with `visible_keys` (evaluation) do not touch it. `StepStats` reads the buffers after
each due step (one small stack on the device, no host sync) and turns the window's values into metric rows
with one host sync at the logging flush. Everything runs on detached tensors: no autograd graph.

Bilinear attention (`model.attn_impl=bilinear`, large d_k): q k^T is x_i (W_q^T W_k) x_j there, and the two
operands (x W_q^T W_k, x) per head are exactly a (q, k) pair of width d_model, so the statistics are
computed from them, chunk-wise like any other q, k; q and k of width d_k are never formed.
"""

from __future__ import annotations

import math

import torch

from andrea_exp.config.choices import normalize_attn_stats
from andrea_exp.instruments.metrics import SATURATION
from andrea_exp.runs import metric_keys as K

STATS = ("score_max", "entropy", "entropy_norm", "max_prob", "max_prob_max", "saturated_frac")
N_STATS = len(STATS)
# pooled over heads and layers by the max (the largest logit, the peakiest row) or by the mean (the rest)
MAX_POOLED = ("score_max", "max_prob_max")
KEYS = {name: f"{K.ATTN_STEP}/{name}" for name in STATS}
KEY_CHUNK = 256  # keys per block on the PyTorch path


# ---------------------------------------------------------------- the PyTorch path


def row_softmax_stats(q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool, key_chunk: int = KEY_CHUNK):
    """q, k (B, H, T, d) -> each row's max m, sum l = sum exp(s - m) and a = sum exp(s - m) (s - m) over its visible
    keys, (B, H, T) float32 each.

    Online over blocks of `key_chunk` keys: only (B, H, T, key_chunk) scores exist at a time.
    """
    q, k = q.detach().float(), k.detach().float()
    B, H, T, _ = q.shape
    m = q.new_full((B, H, T), -math.inf)
    total, a = q.new_zeros((B, H, T)), q.new_zeros((B, H, T))
    rows = torch.arange(T, device=q.device)
    for start in range(0, T, key_chunk):
        keys = k[:, :, start:start + key_chunk]  # (B, H, C, d)
        s = (q @ keys.transpose(-2, -1)) * scale  # (B, H, T, C)
        visible = torch.ones(T, keys.size(2), dtype=torch.bool, device=q.device)
        if causal:
            visible = torch.arange(start, start + keys.size(2), device=q.device)[None, :] <= rows[:, None]  # (T, C)
        m_new = torch.maximum(m, torch.where(visible, s, -math.inf).amax(-1))
        m_safe = torch.where(m_new == -math.inf, 0.0, m_new)  # a row with no visible key yet
        z = s - m_safe[..., None]  # (B, H, T, C), finite
        p = torch.where(visible, torch.exp(z), 0.0)
        alpha = torch.exp(m - m_safe)
        shift = torch.where(total > 0, m - m_safe, 0.0)  # 0 * -inf would be nan
        a = alpha * (a + total * shift) + (p * z).sum(-1)
        total = alpha * total + p.sum(-1)
        m = m_new
    return m, total, a


def visible_counts(T: int, causal: bool, device=None) -> torch.Tensor:
    """(T,) keys each query row sees: i + 1 when causal, T otherwise."""
    return torch.arange(1, T + 1, device=device) if causal else torch.full((T,), T, device=device)


def kept_rows(T: int, causal: bool) -> int:
    """Query rows with more than one visible key (those entropy_norm averages over)."""
    return T - 1 if causal else (T if T > 1 else 0)


def head_stats_from_rows(m, total, a, causal: bool, threshold: float = SATURATION) -> torch.Tensor:
    """Each row's running max m, sum `total` (l) and a, (B, H, T) -> (N_STATS, H) in STATS order (see the
    module docstring)."""
    B, H, T = m.shape
    entropy = total.log() - a / total  # (B, H, T)
    max_prob = 1.0 / total
    n_vis = visible_counts(T, causal, m.device)  # (T,)
    kept = (n_vis > 1).expand_as(entropy)
    n_kept = B * kept_rows(T, causal)  # from the shapes: no host sync
    norm = torch.where(kept, entropy / n_vis.float().log().clamp_min(1e-30), 0.0).sum((0, 2))  # (H,)
    undefined = torch.full_like(norm, math.nan)  # no row with two keys (T == 1)
    return torch.stack([
        m.amax((0, 2)),
        entropy.mean((0, 2)),
        norm / n_kept if n_kept else undefined,
        max_prob.mean((0, 2)),
        torch.where(kept, max_prob, 0.0).amax((0, 2)) if n_kept else undefined,
        (max_prob > threshold).float().mean((0, 2)),
    ])


def head_stats_torch(q, k, scale: float, causal: bool, threshold: float = SATURATION,
                     key_chunk: int = KEY_CHUNK) -> torch.Tensor:
    """The PyTorch path: q, k (B, H, T, d) -> (N_STATS, H) float32 (float32 q k^T even under autocast)."""
    with torch.autocast(q.device.type, enabled=False):
        return head_stats_from_rows(*row_softmax_stats(q, k, scale, causal, key_chunk), causal, threshold)


# ---------------------------------------------------------------- the op, either path


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@torch.library.custom_op("andrea_exp::attn_head_stats", mutates_args=())
def _attn_head_stats(q: torch.Tensor, k: torch.Tensor, enabled: torch.Tensor, scale: float, causal: bool,
                     threshold: float) -> torch.Tensor:
    """(N_STATS, H) float32 from q, k (B, H, T, d). On CUDA with Triton the kernels skip their work when
    enabled[0] == 0 (the result is then undefined); the PyTorch path always computes."""
    if q.is_cuda and triton_available():
        from andrea_exp.instruments.attn_stats_kernel import head_stats_triton

        return head_stats_triton(q, k, enabled, scale, causal, threshold)
    return head_stats_torch(q, k, scale, causal, threshold)


@_attn_head_stats.register_fake
def _(q, k, enabled, scale, causal, threshold):
    return q.new_empty((N_STATS, q.size(1)), dtype=torch.float32)


def head_stats(q: torch.Tensor, k: torch.Tensor, *, scale: float, causal: bool, threshold: float = SATURATION,
               impl: str = "auto", enabled: torch.Tensor | None = None) -> torch.Tensor:
    """Attention statistics per head of q, k (B, H, T, d): (N_STATS, H) float32, rows in STATS order.

    scale multiplies q.k (attention.scale_factor); causal: key j visible to query i only when j <= i.
    impl: auto (Triton on CUDA when present, else PyTorch), torch, triton. Off the autograd graph.
    """
    q, k = q.detach(), k.detach()
    if impl == "torch":
        return head_stats_torch(q, k, scale, causal, threshold)
    if impl == "triton":
        from andrea_exp.instruments.attn_stats_kernel import head_stats_triton

        on = enabled if enabled is not None else torch.ones(1, dtype=torch.int32, device=q.device)
        return head_stats_triton(q, k, on, scale, causal, threshold)
    if impl != "auto":
        raise ValueError(f"impl must be one of auto, torch, triton; got {impl!r}")
    on = enabled if enabled is not None else torch.ones(1, dtype=torch.int32, device=q.device)
    return torch.ops.andrea_exp.attn_head_stats(q, k, on, float(scale), bool(causal), float(threshold))


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


# ---------------------------------------------------------------- in the model


def enable(model) -> torch.Tensor:
    """Give every attention layer of `model` (an Andrea) its statistics buffer; returns the shared flag.

    Call after the model is on its device and before it is compiled or captured."""
    device = next(model.parameters()).device
    flag = torch.ones(1, dtype=torch.int32, device=device)
    for block in model.blocks:
        attn = block.attn
        attn.step_stats = torch.full((N_STATS, attn.n_head), math.nan, device=device)
        attn.step_stats_on = flag
    if device.type == "cuda" and triton_available():
        import andrea_exp.instruments.attn_stats_kernel  # noqa: F401  (Triton imported here, outside any compiled code)
    return flag


def record(attn, q: torch.Tensor, k: torch.Tensor, causal: bool, visible_keys=None) -> None:
    """Attention.forward's hook: q, k (B, H, T, d) as the attention uses them -> attn.step_stats.

    Only in a training forward (train mode, gradients on, no captured stages, every key visible)."""
    if not attn.training or not torch.is_grad_enabled() or attn.stages is not None or visible_keys is not None:
        return
    device_type = q.device.type
    if torch.is_autocast_enabled(device_type):  # the attention kernels see q, k in the autocast dtype
        dtype = torch.get_autocast_dtype(device_type)
        q, k = q.to(dtype), k.to(dtype)
    stats = torch.ops.andrea_exp.attn_head_stats(q.detach(), k.detach().to(q.dtype), attn.step_stats_on,
                                                 float(attn.scale), bool(causal), SATURATION)
    attn.step_stats.copy_(stats)


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

    def __init__(self, model, every: int = 1, per_head: bool = False):
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"train.attn_stats_every must be an integer >= 1; got {every!r}")
        self.flag = enable(model)
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
            self.window.append((step, torch.stack([attn.step_stats for attn in self.layers])))  # (L, N_STATS, H)

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


def from_config(cfg, model) -> StepStats | Off:
    """train.attn_stats (every | off), train.attn_stats_every, train.attn_stats_per_head -> StepStats, or OFF."""
    tc = cfg.train
    if normalize_attn_stats(tc.get("attn_stats", "off")) == "off":
        return OFF
    return StepStats(model, tc.get("attn_stats_every", 1), bool(tc.get("attn_stats_per_head", False)))
