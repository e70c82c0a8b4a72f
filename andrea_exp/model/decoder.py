"""ANDREA: a pre-LayerNorm decoder with learned positions and a switchable attention pipeline.

The query/key width per head (d_k) is independent of d_model and of the value width d_v, so a
sweep over d_k changes nothing else in the model.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from andrea_exp.config.schema import ModelSchema
from andrea_exp.config.variants import normalize_mask_fill, score_transforms
from andrea_exp.model.attention import HEAD_MAJOR, PATHS, Mask
from andrea_exp.model.chunked_loss import OUTPUT_STATS, linear_cross_entropy_with_stats, output_stats, summarise
from andrea_exp.model.head_gemms import head_projection
from andrea_exp.model.sigma_reparam import reparametrize
from andrea_exp.model.step_stats import LayerStats

# The model is built from the settings' own dataclass: every rule is checked when one is constructed
# (config.schema.ModelSchema); the modules below trust its values. ModelConfig is the same class.
ModelConfig = ModelSchema


class Attention(nn.Module):
    """Multi-head self-attention, softmax(mask(q k^T * scale)) v, on the path (attention.PATHS) its settings resolve
    to once (config.variants.resolve_attn_impl): PyTorch's fused kernels (fused), or the formula written out
    head-major (`heads_first`), with q k^T either formed from q and k (explicit) or as the bilinear form
    x_i (W_q,h^T W_k,h) x_j (bilinear). `self.stages`, when set to a dict (Andrea.set_capture), takes the explicit
    path batch-first and receives each stage, (B, H, T, .) (see attention.explicit_attention).

    Why the bilinear form: q_i . k_j = x_i W_q,h^T W_k,h x_j^T, whatever d_k. Through the (d_model,
    d_model) matrix W_q,h^T W_k,h a token costs O(d_model^2) instead of O(d_k d_model), and q, k
    (B*T*H*d_k elements each) are never written: at d_k 4096 and d_model 256 that is most of a step.
    The function and its gradients are the same; only the rounding differs."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.d_k, self.d_v = cfg.n_head, cfg.d_k, cfg.d_v
        self.q = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_k, bias=False)
        self.k = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_k, bias=False)
        self.v = nn.Linear(cfg.d_model, cfg.n_head * cfg.d_v, bias=False)
        self.o = nn.Linear(cfg.n_head * cfg.d_v, cfg.d_model, bias=False)
        self.q_norm = nn.LayerNorm(cfg.d_k) if cfg.qk_layernorm else nn.Identity()
        self.k_norm = nn.LayerNorm(cfg.d_k) if cfg.qk_layernorm else nn.Identity()
        self.scale = cfg.scale_factor  # 1/sqrt(d_k), 1 or 1/d_k (config.variants.SCALES)
        self.causal = bool(cfg.causal)
        self.mask_fill = normalize_mask_fill(cfg.mask_fill)
        self.transforms = score_transforms(cfg)  # of the scaled scores, before the mask (config.variants)
        self.impl = cfg.attn_path  # fused | explicit | bilinear, resolved once: the layer's path (attention.PATHS)
        self.sdpa_backend = cfg.sdpa_backend
        self.fused_qkv = bool(cfg.fused_qkv)
        self.stages: dict | None = None
        self.stats: LayerStats | None = None  # train.attn_stats: the training batch's statistics (step_stats.enable)

    def forward(self, x, visible_keys: torch.Tensor | None = None):
        """x (B, T, d_model) -> (B, T, d_model). visible_keys (B,): batch row b attends only to keys
        j < visible_keys[b], the rest absent (see attention.absent_keys); None: every key, as trained."""
        B, T, _ = x.shape
        path = self.impl if self.stages is None else "captured"
        q, k, v = self.operands(x, path)  # (B, H, T, d_k), (B, H, T, d_k), (B, H, T, d_v); bilinear: d_model, d_model
        mask = Mask(self.causal, self.mask_fill, visible_keys)
        out = None  # the fused statistics pass also attends
        if self.stats is not None and self.stages is None:
            out = self.stats(q, k, v, mask)  # (B, H, T, d_v) or None; self.stats.values: (N_STATS, H)
        if out is None:
            out = PATHS[path](q, k, v, mask, scale=self.scale, transforms=self.transforms, backend=self.sdpa_backend,
                              stages=self.stages)  # (B, H, T, d_v)
        out = out.transpose(1, 2).reshape(B, T, self.n_head * self.d_v)  # (B, T, H*d_v): heads concatenated
        return self.o(out)  # (B, T, d_model)

    def operands(self, x, path: str):
        """x (B, T, d_model) -> q, k (B, H, T, d_k) and v (B, H, T, d_v) as `path` takes them: views of head-major
        (H, B, T, .) tensors on the explicit and bilinear paths (the bilinear form's q, k of width d_model, see
        bilinear_operands), else projected batch-first (project_qkv)."""
        B, T, _ = x.shape
        if path not in HEAD_MAJOR:
            q, k, v = self.project_qkv(x)  # (B, T, H*d_k), (B, T, H*d_k), (B, T, H*d_v)
            q = self.q_norm(q.view(B, T, self.n_head, self.d_k).transpose(1, 2))  # (B, H, T, d_k)
            k = self.k_norm(k.view(B, T, self.n_head, self.d_k).transpose(1, 2))  # (B, H, T, d_k)
            return q, k, v.view(B, T, self.n_head, self.d_v).transpose(1, 2)  # v: (B, H, T, d_v)
        if path == "bilinear":
            q, k = self.bilinear_operands(x)  # (H, B, T, d_model) each
        else:
            q = self.q_norm(self.heads_first(x, self.q, self.d_k))  # (H, B, T, d_k)
            k = self.k_norm(self.heads_first(x, self.k, self.d_k))  # (H, B, T, d_k)
        v = self.heads_first(x, self.v, self.d_v)  # (H, B, T, d_v)
        return q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # (B, H, T, .) views, no copy

    def project_qkv(self, x):
        """x (B, T, d_model) -> q, k (B, T, H*d_k) and v (B, T, H*d_v).

        Fused: one GEMM against the three weights stacked; q, k, v stay separate parameters (their
        names, their gradients and the probe's grad/L{l}/q|k|v are the same either way).
        """
        if not self.fused_qkv:
            return self.q(x), self.k(x), self.v(x)
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])  # (H*(2 d_k + d_v), d_model)
        widths = [self.q.out_features, self.k.out_features, self.v.out_features]
        return F.linear(x, weight).split(widths, dim=-1)

    def heads_first(self, x, linear: nn.Linear, width: int):
        """x (B, T, d_model) -> (H, B, T, width): one batched GEMM over heads, written head-major.

        With heads first, (H, B) fold into one batch dimension of a contiguous tensor, so Q K^T and its
        backward run as plain batched GEMMs; the (B, T, H, d) layout copies q and k (B*T*H*d_k elements
        each) around every GEMM, which dominates the step at d_k 4096 (see head_gemms).
        """
        B, T, C = x.shape
        weight = linear.weight.view(self.n_head, width, C)  # (H, width, d_model): head h's rows of W
        return head_projection(x.reshape(B * T, C), weight).view(self.n_head, B, T, width)  # (H, B, T, width)

    def bilinear_operands(self, x):
        """x (B, T, C) -> (x W_q,h^T W_k,h, x) per head, both (H, B, T, C): their product over C is q k^T.
        The scale stays 1/sqrt(d_k) (self.scale), as for q and k."""
        B, T, C = x.shape
        w_q = self.q.weight.view(self.n_head, self.d_k, C)  # (H, d_k, C)
        w_k = self.k.weight.view(self.n_head, self.d_k, C)  # (H, d_k, C)
        form_t = torch.bmm(w_k.transpose(1, 2), w_q)  # (H, C, C) = (W_q,h^T W_k,h)^T, head_projection's layout
        left = head_projection(x.reshape(B * T, C), form_t).view(self.n_head, B, T, C)  # (H, B, T, C)
        right = x.to(left.dtype).unsqueeze(0).expand(self.n_head, B, T, C)  # (H, B, T, C), no copy
        return left, right


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, visible_keys=None):
        x = x + self.drop(self.attn(self.ln_1(x), visible_keys=visible_keys))
        return x + self.drop(self.mlp(self.ln_2(x)))


class Andrea(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.apply(self._init_gpt2)
        residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # GPT-2: residual projections shrink with depth
        for block in self.blocks:
            nn.init.normal_(block.attn.o.weight, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, std=residual_std)
            self._init_qk(block.attn, cfg.qk_init, cfg.d_model)
            if cfg.sigma_reparam:  # after the initialisation: gamma starts at the initial weights' sigma
                reparametrize(block.attn.q)
                reparametrize(block.attn.k)
        # train.z_loss: the coefficient of mean log Z^2 added to the loss of training forwards (the training loop
        # sets it; evaluation and probes read the cross-entropy alone)
        self.z_loss = 0.0
        # the last training forward's output logits (chunked_loss.OUTPUT_STATS, means per row): kept on the
        # device for the training loop's log window (instruments.out_logits); not part of the checkpoint
        self.register_buffer("out_stats", torch.zeros(len(OUTPUT_STATS)), persistent=False)

    @staticmethod
    def _init_gpt2(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    @staticmethod
    def _init_qk(attn: Attention, qk_init: str, d_model: int):
        if qk_init == "unit":
            # Inputs come out of a LayerNorm with unit-variance components, so std 1/sqrt(d_model)
            # gives q and k components of unit variance: the premise of "dot products grow like sqrt(d_k)".
            for lin in (attn.q, attn.k):
                nn.init.normal_(lin.weight, std=1.0 / math.sqrt(d_model))
        elif qk_init == "torch":
            for lin in (attn.q, attn.k):
                lin.reset_parameters()
        # gpt2: std 0.02, as _init_gpt2 left it

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_emb.weight.numel() if non_embedding else n

    def forward(self, idx, targets=None, visible_keys: torch.Tensor | None = None):
        """idx: (B, T) token ids. Returns logits (B, T, V) and, given targets, the mean cross-entropy.

        With targets and `loss_impl` "chunked" the logits are never formed as a whole and None is
        returned in their place. `visible_keys` (B,) limits row b's attention to its first visible_keys[b]
        tokens (see `hidden`).
        """
        x = self.hidden(idx, visible_keys=visible_keys)  # (B, T, d_model)
        z_loss = self.z_loss if self.training else 0.0
        if targets is not None and self.cfg.loss_impl == "chunked":
            loss, stats = self._chunked_loss(x, targets, z_loss)
            self._keep_out_stats(stats)
            return None, loss
        logits = self.head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            flat = logits.float().view(-1, logits.size(-1))  # (B*T, V)
            loss = F.cross_entropy(flat, targets.reshape(-1))
            if self.training:  # z_loss is 0 outside training
                lse = torch.logsumexp(flat, dim=-1)  # (B*T,)
                if z_loss:
                    loss = loss + z_loss * lse.square().mean()
                self._keep_out_stats(summarise(output_stats(flat, lse)[None], lse.numel()))  # (4,)
        return logits, loss

    def _keep_out_stats(self, stats: torch.Tensor) -> None:
        if self.training:
            self.out_stats.copy_(stats.detach())

    def hidden(self, idx, visible_keys: torch.Tensor | None = None):
        """idx (B, T) -> the final LayerNorm's output (B, T, d_model), what the head turns into logits.

        visible_keys (B,) int, values in 1..T, or None: every attention layer of row b sees only keys
        j < visible_keys[b], the others absent (weight exactly 0). Positions below visible_keys[b] then
        compute what a forward over idx[b, :visible_keys[b]] computes (the rest of the model is per token).
        """
        B, T = idx.shape
        if idx.size(1) > self.cfg.block_size:
            raise ValueError(f"a sequence of {T} tokens exceeds model.block_size ({self.cfg.block_size})")
        # positions 0..T-1 are the table's first T rows: a slice, whose backward is a sum over the batch
        # (a lookup's backward sorts the indices, several kernels of a small cell's step)
        x = self.tok_emb(idx) + self.pos_emb.weight[:T]  # (B, T, d_model)
        for block in self.blocks:
            x = block(x, visible_keys=visible_keys)
        return self.ln_f(x)  # (B, T, d_model)

    def _chunked_loss(self, x, targets, z_loss: float = 0.0):
        """The plain path's loss without its (B*T, V) logits, and the logits' stats; GEMMs in the dtype the head
        would use."""
        device_type = x.device.type
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
        rows = x.reshape(-1, x.size(-1)).to(dtype)  # (B*T, d_model)
        return linear_cross_entropy_with_stats(rows, self.head.weight.to(dtype), targets.reshape(-1),
                                               self.cfg.loss_chunk_rows, z_loss)

    def set_capture(self, on: bool) -> list[dict]:
        """Switch every layer to the explicit path and return the per-layer stage dicts (or clear them)."""
        captured = []
        for block in self.blocks:
            block.attn.stages = {} if on else None
            captured.append(block.attn.stages)
        return captured

    def param_groups(self, weight_decay: float):
        """AdamW groups: decay the weight matrices, not biases, LayerNorm weights or embedding tables.

        The position table and an untied token table are lookups: a row is updated only when its
        position or token occurs, so decay would shrink rare rows toward zero rather than regularise.
        A tied token table is also the output head, whose every row gets a gradient at each step: it
        is decayed like any other linear layer, which also bounds the logits' scale.
        """
        head = self.head.weight
        lookups = {id(self.pos_emb.weight)} | ({id(self.tok_emb.weight)} - {id(head)})
        decay, no_decay = [], []
        for p in {id(p): p for p in self.parameters() if p.requires_grad}.values():
            (decay if p.dim() >= 2 and id(p) not in lookups else no_decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
