"""Claims that need no training, measured directly on the pipeline and the model (CPU or meta device).

C1: the (T, T) score matrix and its size; C2: std of q.k for random vectors; C3/C9 (synthetic side):
softmax peakiness and the gradient through softmax for random unit-variance q, k; C6: exact checks of
the masked softmax and -inf vs -1e9 across dtypes; C8: the andrea_120m preset's shapes and size.
"""

from __future__ import annotations

import copy
import functools
import math

import torch
from omegaconf import OmegaConf

from andrea_exp.config.schema import CONF_DIR, ModelSchema
from andrea_exp.instruments.metrics import normalized_entropy, row_entropy
from andrea_exp.model.attention import explicit_attention, future_mask, scale_factor
from andrea_exp.model.decoder import Andrea

CLAIMED_DOT_STD = {64: 8.0, 256: 16.0, 4096: 64.0}  # C2's numbers
GPT2_VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64


def computed_once(fn):
    """Each of these numbers depends on its arguments alone (seeded generators, no state), and a report asks for
    some several times (a claim's evidence and its statements): each is computed once per process and every
    caller gets a copy of its own."""
    cached = functools.cache(fn)

    @functools.wraps(fn)
    def once(*args, **kwargs):
        try:
            return copy.deepcopy(cached(*args, **kwargs))
        except TypeError:  # an unhashable argument (a list): computed afresh
            return fn(*args, **kwargs)
    once.cache_info = cached.cache_info
    once.cache_clear = cached.cache_clear
    return once


@computed_once
def score_matrix_count(T: int = 1024, d_k: int = 64) -> dict:
    """Run the explicit pipeline on one head and count its scores."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, T, d_k, generator=gen) for _ in range(3))  # (B=1, H=1, T, d_k)
    stages: dict = {}
    explicit_attention(q, k, v, scale=scale_factor("sqrt", d_k), causal=True, stages=stages)
    scores = stages["scores"]  # (1, 1, T, T)
    return {"T": T, "shape": tuple(scores.shape[-2:]), "count": scores[0, 0].numel()}


@computed_once
def dot_product_std(d_ks=(64, 256, 4096), n_pairs: int = 8000, seed: int = 0) -> list[dict]:
    """Std of q.k for random q, k with unit-variance components, and for random unit-norm q, k."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for d_k in d_ks:
        unit_var, unit_norm = [], []
        for chunk in range(0, n_pairs, 1000):
            m = min(1000, n_pairs - chunk)
            q, k = torch.randn(m, d_k, generator=gen), torch.randn(m, d_k, generator=gen)  # (m, d_k), N(0, 1)
            unit_var.append((q * k).sum(-1))
            qn, kn = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
            unit_norm.append((qn * kn).sum(-1))
        rows.append({"d_k": d_k, "unit_variance": torch.cat(unit_var).std().item(),
                     "unit_norm": torch.cat(unit_norm).std().item(), "sqrt_d_k": math.sqrt(d_k)})
    return rows


def row_entropy_norm(pattern: torch.Tensor) -> torch.Tensor:
    """Entropy / log(visible keys) per causal row, rows 1.. (row 0 has one key). pattern: (..., T, T)."""
    T = pattern.size(-1)
    return normalized_entropy(row_entropy(pattern), torch.arange(1, T + 1))[..., 1:]  # (..., T-1)


@computed_once
def synthetic_softmax(d_ks=(16, 64, 256, 1024, 4096), T: int = 64, d_v: int = 64, batch: int = 8,
                      seed: int = 0) -> list[dict]:
    """Peakiness and the gradient through softmax for random unit-variance q, k, scaled and unscaled.

    The upstream gradient is a fixed random tensor on the output (loss = sum(out * g)), so only the
    softmax's own Jacobian differs between settings. grad_scores is the Frobenius norm of d loss / d scores,
    grad_row_p50 the median over query rows of ||d loss / d S_i||.
    """
    rows = []
    for d_k in d_ks:
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn(batch, 1, T, d_k, generator=gen)  # (B, H=1, T, d_k)
        k = torch.randn(batch, 1, T, d_k, generator=gen)
        v = torch.randn(batch, 1, T, d_v, generator=gen)  # (B, 1, T, d_v)
        g = torch.randn(batch, 1, T, d_v, generator=gen)
        for mode in ("sqrt", "none"):
            stages: dict = {}
            qg = q.clone().requires_grad_(True)
            out, pattern = explicit_attention(qg, k, v, scale=scale_factor(mode, d_k), causal=True, stages=stages)
            (out * g).sum().backward()
            rows_p = pattern.detach()[..., 1:, :]  # (B, 1, T-1, T): rows with more than one key
            rows.append({"d_k": d_k, "scale": mode, "entropy_norm": row_entropy_norm(pattern.detach()).mean().item(),
                         "max_prob": rows_p.max(-1).values.mean().item(),
                         "saturated_frac": (rows_p.max(-1).values > 0.99).float().mean().item(),
                         "grad_scores": stages["scores"].grad.norm().item(),
                         # per query row (rows with > 1 visible key), as the probe's grad/scores_row_p50
                         "grad_row_p50": stages["scores"].grad[..., 1:, :].norm(dim=-1).median().item()})
    return rows


@computed_once
def pipeline_checks(T: int = 16, d_k: int = 32, seed: int = 0) -> dict:
    """Exact fp32 checks of the masked softmax (C6), with -inf and with -1e9."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, T, d_k, generator=gen) for _ in range(3))  # (B, H, T, d_k)
    probs = {}
    for fill in (-math.inf, -1e9):
        _, probs[fill] = explicit_attention(q, k, v, scale=scale_factor("sqrt", d_k), causal=True, mask_fill=fill)
    p = probs[-math.inf]  # (B, H, T, T)
    future = future_mask(T, T)
    one_hot = torch.zeros(T)
    one_hot[0] = 1.0
    return {"row_sum_max_dev": (p.sum(-1) - 1).abs().max().item(),
            "future_mass_max": p[..., future].abs().max().item(),
            "row0_one_hot": bool(torch.equal(p[..., 0, :], one_hot.expand_as(p[..., 0, :]))),
            "inf_vs_1e9_max_diff": (probs[-math.inf] - probs[-1e9]).abs().max().item()}


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@computed_once
def mask_fill_precision(magnitudes=(1e0, 1e2, 1e4, 1e6, 1e8, 1e9, 1e10), dtypes=("fp32", "bf16", "fp16"),
                        softmax_in=("fp32", "native"), T: int = 32, seed: int = 0) -> list[dict]:
    """-inf against -1e9 when the scores themselves are huge (unscaled), per dtype.

    Scores are random with std `magnitude`, rounded to the dtype as q k^T would be. `softmax_in`
    fp32 is the project's pipeline (softmax of scores.float()); native is a softmax in the dtype
    itself. Each row: does filling with -1e9 work at all (fp16 cannot hold it), the largest
    |P(-inf) - P(-1e9)|, whether the -1e9 result puts mass on the future, and non-finite rows.
    """
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(4, T, T, generator=gen)  # (B, T, T)
    future = future_mask(T, T)
    rows = []
    for name in dtypes:
        dtype = DTYPES[name]
        for magnitude in magnitudes:
            scores = (base * magnitude).to(dtype)  # (B, T, T) in the dtype, overflow included
            for where in softmax_in:
                row = {"dtype": name, "magnitude": magnitude, "softmax": where, "fill_error": "",
                       "max_abs_diff": math.nan, "future_mass_1e9": math.nan, "nonfinite_rows_inf": math.nan,
                       "nonfinite_rows_1e9": math.nan}
                out = {}
                for fill in (-math.inf, -1e9):
                    try:
                        filled = scores.masked_fill(future, fill)  # (B, T, T)
                    except RuntimeError as err:
                        row["fill_error"] = str(err).split("\n")[0]
                        continue
                    out[fill] = torch.softmax(filled.float() if where == "fp32" else filled, dim=-1).float()
                p_inf = out[-math.inf]
                row["nonfinite_rows_inf"] = int((~torch.isfinite(p_inf)).any(-1).sum())
                if -1e9 in out:
                    p_fin = out[-1e9]
                    both = torch.isfinite(p_inf) & torch.isfinite(p_fin)
                    diff = (p_inf - p_fin).abs()[both]
                    row["max_abs_diff"] = diff.max().item() if diff.numel() else math.nan
                    row["future_mass_1e9"] = torch.nan_to_num(p_fin[..., future], nan=0.0).abs().max().item()
                    row["nonfinite_rows_1e9"] = int((~torch.isfinite(p_fin)).any(-1).sum())
                rows.append(row)
    return rows


@computed_once
def model_120m_shapes(vocab_size: int = GPT2_VOCAB) -> dict:
    """Build the andrea_120m preset on the meta device, run one forward over its full context, read every
    shape (C8)."""
    preset = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "andrea_120m.yaml"), resolve=True)
    cfg = ModelSchema(**{**preset, "vocab_size": vocab_size})
    T = cfg.block_size
    with torch.device("meta"):
        model = Andrea(cfg)
    captured = model.set_capture(True)
    concat = {}
    hook = model.blocks[0].attn.o.register_forward_hook(lambda mod, inp, out: concat.update(x=inp[0], y=out))
    logits, _ = model(torch.zeros(1, T, dtype=torch.long, device="meta"))
    hook.remove()
    model.set_capture(False)
    parts = {"token embedding (tied head)": model.tok_emb.weight.numel(),
             "position embedding": model.pos_emb.weight.numel(),
             "attention (q, k, v, o)": sum(p.numel() for b in model.blocks for p in b.attn.parameters()),
             "MLP": sum(p.numel() for b in model.blocks for p in b.mlp.parameters()),
             "LayerNorms": sum(p.numel() for n, p in model.named_parameters() if "ln" in n)}
    return {"d_model": cfg.d_model, "n_head": cfg.n_head, "n_layer": cfg.n_layer, "d_k": cfg.d_k, "d_v": cfg.d_v,
            "T": T, "vocab_size": vocab_size, "params": model.num_params(), "parts": parts,
            "scores_shape": tuple(captured[0]["pattern"].shape),  # (1, H, T, T)
            "head_out_shape": tuple(concat["x"][0].unflatten(-1, (cfg.n_head, cfg.d_v))[:, 0].shape),  # (T, d_v)
            "concat_shape": tuple(concat["x"].shape[1:]),  # (T, H * d_v) into W_O
            "w_o_out_shape": tuple(concat["y"].shape[1:]), "logits_shape": tuple(logits.shape)}
