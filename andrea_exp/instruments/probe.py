"""An instrumented forward and backward pass on a fixed held-out batch.

Every `probe.every` steps the train loop asks for `Probe.measure(step)`: the explicit attention path
runs on the probe batch in float32, and the result is softmax peakiness per layer (and head),
pre-softmax score statistics, q/k spread, and gradient norms, including d loss / d scores, the
gradient that passes through softmax.

A probe never changes training: gradients come from torch.autograd.grad (parameters' .grad fields
are untouched), no optimiser step runs, random streams are forked and restored, train/eval mode is
restored, and capture is switched off even when something fails. All metric tensors are gathered
into one tensor and copied to the host once per probe.

Averaging (all plain means, every row weighted equally):
- a head's entropy / max_prob / saturated_frac is the mean over the batch and query rows;
  entropy_norm skips rows with one visible key (log 1 = 0);
- a head's score_std / score_max are the std / max over all its visible (unmasked) entries;
- `attn/L{l}/<stat>` is the mean over the layer's heads; `attn/<stat>` the mean over layers
  (so, every layer having the same heads and rows, the mean over layers, heads and rows);
- `attn/L{l}/q_std`, `k_std`: population std of all q (k) components of the layer, heads pooled;
  `attn/q_std`, `attn/k_std`: their mean over layers;
- `grad/L{l}/scores`: L2 norm of d loss / d scores of the layer (masked entries get exactly 0);
  `grad/scores`: the global L2 norm over layers; `grad/...` of parameters: joint L2 norm per group.

Per row, over the query rows with more than one visible key (a causal row 0 sees one key and is left
out; without the mask every row counts), each layer's rows being its (batch, head, query) triples:
- `attn/L{l}/jac_norm`: mean Frobenius norm of the softmax Jacobian diag(p) - p p^T of the row;
  `attn/L{l}/jac_dead_frac`: share of rows whose norm is below `probe.dead_jac` (default 1e-3);
- `grad/L{l}/scores_row_p10|p50|p90`: quantiles (linear interpolation) of the row norms
  ||d loss / d S_i||_2, loss = the probe's mean token cross-entropy; `grad/L{l}/scores_dead_frac`:
  share of rows below `probe.dead_grad` (default 1e-6); `grad/L{l}/scores_top10_share`: share of
  the summed squared row norms carried by the top ceil(10%) of rows. The loss being a mean over the
  probe's B * T tokens, a row norm scales like 1 / (B * T): compare these readings, and the fixed
  dead_grad threshold, between runs of the same probe.batch_size and sequence length.
- Pooled: means and fractions (jac_norm, jac_dead_frac, scores_dead_frac) are the mean over layers
  of the per-layer values (every layer has the same rows, so also the mean over all rows); quantiles
  and top10_share are taken over all rows of all layers together, not averaged over layers.
- `attn/L{l}/qk_spectral`: the largest singular value over the layer's heads of the logit's bilinear
  form scale * W_q^h^T W_k^h (d_model x d_model; the projections have no bias). With QK-LayerNorm the
  projections' size is normalised away, and the value is instead that of scale * C diag(g_q * g_k) C,
  g the two LayerNorms' gains (shared by the heads) and C the centring, the form acting on the
  standardised query and key (norm ~ sqrt(d_k)); LayerNorm biases are left out.
  `attn/qk_spectral`: the max over layers.

Owns the probe, its steps in the order a probe runs them: `Probe` holds the settings and parameter
groups and runs one forward and backward pass (`Probe.measure`); forward capture (`LayerCapture`)
reduces each attention layer as it runs and its d loss / d scores as the backward pass reaches it,
through the per-layer reductions (`forward_layer_stats`, `grad_layer_stats`); the `put_*` steps pool
those into metric rows on a `MetricSheet` (attention statistics, gradient norms, Jacobian and gradient
rows, qk_spectral), which is copied to the host once.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from andrea_exp.config.schema import ProbeSchema
from andrea_exp.instruments.metrics import (
    component_std,
    first_kept_row,
    head_attention_stats,
    qk_layernorm_spectral_norm,
    qk_spectral_norm,
    row_gradient_stats,
    softmax_jacobian_norm,
)
from andrea_exp.runs import metric_keys as mk

ATTN_STATS = ("entropy", "entropy_norm", "max_prob", "saturated_frac", "score_std", "score_max")
# row_gradient_stats name -> pooled key; the per-layer key is metric_keys.per_layer(key, l)
ROW_GRAD_KEYS = {"row_p10": mk.GRAD_SCORES_ROW_P10, "row_p50": mk.GRAD_SCORES_ROW_P50,
                 "row_p90": mk.GRAD_SCORES_ROW_P90, "dead_frac": mk.GRAD_SCORES_DEAD_FRAC,
                 "top10_share": mk.GRAD_SCORES_TOP10_SHARE}


class Probe:
    def __init__(self, model, tokens: torch.Tensor, probe_cfg: ProbeSchema, run_dir: Path, drawer=None):
        """model: the raw (uncompiled, unwrapped) Andrea; tokens: (B, T+1) held-out batch on its device;
        probe_cfg: the probe group (its values checked by validate); drawer: where the maps' PNGs are drawn
        (map_worker.BackgroundDrawer), None: here, at once."""
        if tokens.dim() != 2 or tokens.size(1) < 2:
            raise ValueError(f"probe tokens must have shape (B, T+1) with T >= 1; got {tuple(tokens.shape)}")
        self.model = model
        self.tokens = tokens
        self.per_head = probe_cfg.per_head
        self.maps_heads = probe_cfg.maps_heads
        self.dead_jac = probe_cfg.dead_jac
        self.dead_grad = probe_cfg.dead_grad
        self.map_dir = Path(run_dir) / "attention_maps"
        self.drawer = drawer
        self.n_layer = len(model.blocks)
        self.n_head = model.cfg.n_head
        groups = param_groups(model)
        self.params = list({id(p): p for ps in groups.values() for p in ps}.values())  # tied weights once
        self.group_names = list(groups)
        self.membership = group_membership(groups, self.params).to(tokens.device)  # (G, P)

    @contextlib.contextmanager
    def _instrumented(self):
        """Eval mode (dropout off), forked RNG, capture on; everything restored on exit, error or not."""
        model = self.model
        device = self.tokens.device
        was_training = model.training
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # the CPU stream always, the probe's GPU when on one
            try:
                model.eval()
                yield model.set_capture(True)
            finally:
                model.set_capture(False)
                model.train(was_training)

    def measure(self, step: int) -> dict:
        """Metrics of the probe batch at this step (see the module docstring for the averaging).

        Memory: each layer's scores, pattern, q and k are reduced as soon as its attention has run (a
        forward hook), and d loss / d scores as soon as the backward pass reaches it (a tensor hook), so
        no (L, B, H, T, T) tensor is ever built and only one layer's (B, H, T, T) gradient lives at a
        time; what is kept per layer are (H,)-sized statistics and the (N,) row norms. The patterns
        the backward pass needs are the probe's only full-size tensors across layers.
        """
        x, y = self.tokens[:, :-1], self.tokens[:, 1:]  # (B, T), (B, T)
        # the kept rows, the same in every layer (model.causal sets every layer's mask)
        first = first_kept_row(x.size(1), x.size(1), self.model.blocks[0].attn.causal)
        capture = LayerCapture(self.n_layer, first, self.dead_jac)
        sheet = MetricSheet()
        with self._instrumented() as stages, torch.enable_grad(), \
                torch.autocast(device_type=self.tokens.device.type, enabled=False):
            with capture.hooked(self.model.blocks, stages):
                _, loss = self.model(x, y)
                grads = torch.autograd.grad(loss, self.params, allow_unused=True)  # fires the scores' hooks
            param_grads = [torch.zeros_like(p) if g is None else g for p, g in zip(self.params, grads)]
            forward, backward = capture.forward, capture.backward_or_zero(x.device)
            sheet.put(["probe/loss"], loss)
            put_attention_stats(sheet, forward, self.per_head)
            put_score_grads(sheet, backward)
            put_param_grads(sheet, self.group_names, self.membership, param_grads)
            put_jacobian_rows(sheet, forward)
            put_gradient_rows(sheet, torch.stack([layer["rows"] for layer in backward]), self.dead_grad)
            put_qk_spectral(sheet, self.model)
        return sheet.to_host()

    @torch.no_grad()
    def draw_maps(self, step: int) -> dict[str, Path]:
        """PNG attention maps of the first probe sequence: a few heads of layer 0 and of the last layer, with their
        float32 arrays in step{step}.npz (L0, L{last}: (heads, T, T)). With a drawer the PNGs are drawn there and
        the mapping returned is its PendingMaps (wait() before reading them)."""
        with self._instrumented() as stages, torch.autocast(device_type=self.tokens.device.type, enabled=False):
            self.model(self.tokens[:1, :-1])
            patterns = {f"L{li}": stages[li]["pattern"][0, : self.maps_heads].float().cpu().numpy()
                        for li in sorted({0, self.n_layer - 1})}
        self.map_dir.mkdir(parents=True, exist_ok=True)
        arrays = self.map_dir / f"step{step:07d}.npz"
        np.savez(arrays, **patterns)
        maps = [(name, str(self.map_dir / f"step{step:07d}_{name}.png"), f"layer {name[1:]}, step {step}")
                for name in patterns]
        if self.drawer is not None:
            return self.drawer.submit(arrays, maps)
        from andrea_exp.instruments.maps import draw_arrays  # matplotlib: only where a run draws itself

        return {f"attn_map/{name}": png for name, png in draw_arrays(arrays, maps).items()}  # as the drawer would


# ---- parameter groups: which parameters each grad/... norm covers ------------------------------------------


def param_groups(model) -> dict[str, list[torch.Tensor]]:
    """Metric name -> the parameters whose joint gradient norm it reports."""
    groups: dict[str, list[torch.Tensor]] = {}
    for li, block in enumerate(model.blocks):
        attn = block.attn
        groups[f"grad/L{li}/q"] = [*attn.q.parameters(), *attn.q_norm.parameters()]
        groups[f"grad/L{li}/k"] = [*attn.k.parameters(), *attn.k_norm.parameters()]
        groups[f"grad/L{li}/v"] = list(attn.v.parameters())
        groups[f"grad/L{li}/o"] = list(attn.o.parameters())
        groups[f"grad/L{li}/mlp"] = list(block.mlp.parameters())
    groups["grad/embed"] = [model.tok_emb.weight, model.pos_emb.weight]
    # With tied embeddings (the default) head.weight IS tok_emb.weight: one tensor whose gradient
    # sums the input and output uses, so grad/head reports that same tied gradient.
    groups["grad/head"] = [model.head.weight]
    return groups


def group_membership(groups: dict[str, list[torch.Tensor]], params: list[torch.Tensor]) -> torch.Tensor:
    """(G, P) 0/1 matrix: row g marks the tensors (columns, in `params` order) that group g's norm covers."""
    column = {id(p): i for i, p in enumerate(params)}
    membership = torch.zeros(len(groups), len(params))  # (G, P)
    for g, ps in enumerate(groups.values()):
        for p in ps:
            membership[g, column[id(p)]] = 1.0
    return membership


# ---- forward capture ---------------------------------------------------------------------------------------


class LayerCapture:
    """Each attention layer's statistics, reduced as soon as they exist, so no full-size tensor is kept.

    forward[l]: head stats, q/k std, Jacobian stats, filled by a forward hook on layer l as it runs;
    backward[l]: d loss / d scores norm and row norms, filled by a hook on layer l's scores tensor when
    the backward pass reaches it (empty for a layer the loss does not reach).
    """

    def __init__(self, n_layer: int, first: int, dead_jac: float):
        self.first = first  # the first kept query row (rows before it see one key)
        self.dead_jac = dead_jac
        self.forward: list[dict] = [{} for _ in range(n_layer)]
        self.backward: list[dict] = [{} for _ in range(n_layer)]

    @contextlib.contextmanager
    def hooked(self, blocks, stages: list[dict]):
        """While active, each block's attention fills forward[l] and frees its captured tensors."""
        handles = [block.attn.register_forward_hook(self._after_attention(li, stages))
                   for li, block in enumerate(blocks)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _after_attention(self, li: int, stages: list[dict]):
        def hook(module, args, output):
            stage = stages[li]
            scores, pattern = stage.pop("scores"), stage.pop("pattern")  # (B, H, T, T) each
            q, k = stage.pop("q"), stage.pop("k")  # (B, H, T, d_k) each
            self.forward[li] = forward_layer_stats(scores, pattern, q, k, self.first, module.causal, self.dead_jac)
            if scores.requires_grad:
                scores.register_hook(lambda g: self.backward.__setitem__(li, grad_layer_stats(g, self.first)))
        return hook

    def backward_or_zero(self, device: torch.device) -> list[dict]:
        """backward, a layer the loss does not reach read as a zero gradient."""
        return [layer or grad_layer_stats(torch.zeros(self.forward[li]["shape"], device=device), self.first)
                for li, layer in enumerate(self.backward)]


# ---- per-layer reduction -----------------------------------------------------------------------------------


@torch.no_grad()
def forward_layer_stats(scores, pattern, q, k, first: int, causal: bool, dead_jac: float) -> dict:
    """One layer's forward statistics; scores, pattern: (B, H, T, T); q, k: (B, H, T, d_k)."""
    jac = softmax_jacobian_norm(pattern[..., first:, :]).reshape(-1)  # (N,), N = B * H * kept rows
    return {"head": head_attention_stats(scores, pattern, causal),  # each (H,)
            "q": component_std(q, (0, 1, 2, 3)), "k": component_std(k, (0, 1, 2, 3)),  # () each
            "jac_norm": jac.mean(), "jac_dead_frac": (jac < dead_jac).float().mean(),  # () each
            "shape": scores.shape}


@torch.no_grad()
def grad_layer_stats(score_grad: torch.Tensor, first: int) -> dict:
    """One layer's d loss / d scores (B, H, T, T) -> its L2 norm and the (N,) norms of its kept rows."""
    g = score_grad.float()  # (B, H, T, T)
    return {"norm": torch.linalg.vector_norm(g),  # ()
            "rows": torch.linalg.vector_norm(g[..., first:, :], dim=-1).reshape(-1)}  # (N,)


# ---- metric rows: pooling the per-layer reductions ---------------------------------------------------------


class MetricSheet:
    """Metric names and their values, kept on the device and copied to the host in one sync."""

    def __init__(self):
        self.names: list[str] = []
        self.pieces: list[torch.Tensor] = []

    def put(self, keys: list[str], values: torch.Tensor) -> None:
        self.names.extend(keys)
        self.pieces.append(values.detach().float().reshape(-1))

    def put_layers(self, key: str, per_layer: torch.Tensor, pooled: torch.Tensor) -> None:
        """attn/x, (L,), () -> attn/L0/x ... attn/L{L-1}/x, then attn/x."""
        keys = [mk.per_layer(key, li) for li in range(per_layer.numel())] + [key]
        self.put(keys, torch.cat([per_layer, pooled.reshape(1)]))

    def to_host(self) -> dict[str, float]:
        host = torch.cat(self.pieces).cpu().tolist()  # the probe's one host sync
        return dict(zip(self.names, host))


def put_attention_stats(sheet: MetricSheet, forward: list[dict], per_head: bool) -> None:
    """attn/<stat>: mean over heads per layer, then over layers (per head too when asked); attn/score_max_max: the
    largest logit, max over heads per layer, then over layers; q_std, k_std."""
    for stat in ATTN_STATS:
        by_head = torch.stack([layer["head"][stat] for layer in forward])  # (L, H)
        per_layer = by_head.mean(-1)  # (L,): mean over heads
        sheet.put_layers(f"attn/{stat}", per_layer, per_layer.mean())  # pooled: mean over layers
        if stat == "score_max":  # and the largest itself: per layer the max over heads, pooled over layers
            largest = by_head.amax(-1)  # (L,)
            sheet.put_layers(mk.ATTN_SCORE_MAX_MAX, largest, largest.amax())
        if per_head:
            L, H = by_head.shape
            sheet.put([f"attn/L{li}/H{h}/{stat}" for li in range(L) for h in range(H)], by_head)
    for name in ("q", "k"):
        per_layer = torch.stack([layer[name] for layer in forward])  # (L,)
        sheet.put_layers(f"attn/{name}_std", per_layer, per_layer.mean())


def put_score_grads(sheet: MetricSheet, backward: list[dict]) -> None:
    """grad/L{l}/scores: L2 norm of each layer's d loss / d scores; grad/scores: global L2 over layers."""
    per_layer = torch.stack([layer["norm"] for layer in backward])  # (L,)
    sheet.put_layers("grad/scores", per_layer, per_layer.norm())


def put_param_grads(sheet: MetricSheet, group_names: list[str], membership: torch.Tensor,
                    param_grads: list[torch.Tensor]) -> None:
    """grad/<group>: joint L2 norm of each parameter group's gradients."""
    squares = torch.stack(torch._foreach_norm(param_grads)).float() ** 2  # (P,), one fused kernel
    sheet.put(group_names, (membership @ squares).sqrt())  # (G, P) @ (P,) -> (G,)


# ---- Jacobian and gradient rows ----------------------------------------------------------------------------


def put_jacobian_rows(sheet: MetricSheet, forward: list[dict]) -> None:
    """attn/jac_norm, attn/jac_dead_frac: each layer's mean over its kept rows; pooled: mean over layers."""
    for key, name in ((mk.ATTN_JAC_NORM, "jac_norm"), (mk.ATTN_JAC_DEAD_FRAC, "jac_dead_frac")):
        per_layer = torch.stack([layer[name] for layer in forward])  # (L,)
        sheet.put_layers(key, per_layer, per_layer.mean())


@torch.no_grad()
def put_gradient_rows(sheet: MetricSheet, row_norms: torch.Tensor, dead_grad: float) -> None:
    """Quantiles, dead share and top-10% share of the row norms ||d loss / d S_i||.

    row_norms: (L, N), each layer's norms over its N = B * H * kept rows (the kept rows are a suffix of
    the query axis: a slice, no host sync). Quantiles and top10_share pool all rows of all layers;
    dead_frac pools as the mean over layers (the same value, every layer having N rows).
    """
    by_layer = row_gradient_stats(row_norms, dead_grad)  # each (L,)
    pooled = row_gradient_stats(row_norms.reshape(-1), dead_grad)  # each (): all rows of all layers
    pooled["dead_frac"] = by_layer["dead_frac"].mean()  # a fraction: the mean over layers (same value)
    for name, key in ROW_GRAD_KEYS.items():
        sheet.put_layers(key, by_layer[name], pooled[name])


@torch.no_grad()
def put_qk_spectral(sheet: MetricSheet, model) -> None:
    """attn/L{l}/qk_spectral: max over heads of the logit form's largest singular value; pooled: max over layers."""
    attns = [block.attn for block in model.blocks]
    scale = attns[0].scale
    if model.cfg.qk_layernorm:
        per_layer = qk_layernorm_spectral_norm(torch.stack([a.q_norm.weight for a in attns]),
                                               torch.stack([a.k_norm.weight for a in attns]), scale)  # (L,)
    else:
        per_head = qk_spectral_norm(torch.stack([a.q.weight for a in attns]),
                                    torch.stack([a.k.weight for a in attns]), model.cfg.n_head, scale)  # (L, H)
        per_layer = per_head.amax(-1)  # (L,)
    sheet.put_layers(mk.ATTN_QK_SPECTRAL, per_layer, per_layer.amax())
