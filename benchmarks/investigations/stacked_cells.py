"""Would cells trained as one stacked step be faster? Times C claims-grid cells as one step against one cell.

A claims-grid cell's step is about 300 kernels of a few microseconds each, 1.5 ms against an arithmetic
bound of 0.11 ms at d_k 64 (benchmarks/results/cell_breakdown_h200.json). Cells of one d_k have the same
shapes and differ only in the scale and the mask, so C of them could run as one step whose every kernel
does C cells' work: weights stacked on a leading cell axis, linear layers as batched GEMMs. If the small
kernels' time were mostly fixed cost, C cells would cost little more than one. On the H200 they do not
(benchmarks/results/stacked_cells_h200.json): `--profile` shows the one-cell step's kernels busy for
91% of its wall time, and stacked cells cost 1.3 ms a cell at d_k 64, against the package's 1.52 ms.

This file is a measurement, not the package's model: `StackedCells` is built from C `Andrea` models (the
package's, andrea_small shapes), computes the same losses (checked here and in tests/test_stacked_cells.py
on the CPU, float64), and trains with one AdamW over the stacked tensors and a per-cell gradient norm and
clip, as each cell's own step would. It covers what the grid's cells use: pre-LN blocks, tied embeddings,
fused q/k/v, SDPA for d_k <= 256, the bilinear form x (W_q,h^T W_k,h) x^T above it, a plain cross-entropy.

    PYTHONPATH=. python3 benchmarks/investigations/stacked_cells.py --out /tmp/stacked.json      # H200: under a minute
    PYTHONPATH=. python3 benchmarks/investigations/stacked_cells.py --smoke --out /tmp/stacked.json  # CPU: the check
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common import git_commit, timed, write_result

# the four cells of one d_k in the claims grid: (scaled, causal)
VARIANTS = ((True, True), (True, False), (False, True), (False, False))


class StackedCells:
    """C cells of one shape as stacked leaf tensors (C, ...); `loss(idx, targets)` -> (C,) per-cell losses."""

    def __init__(self, models, scaled: list[bool], causal: list[bool]):
        cfg = models[0].cfg
        self.C, self.D, self.H, self.d_k, self.d_v = len(models), cfg.d_model, cfg.n_head, cfg.d_k, cfg.d_v
        self.bilinear = cfg.d_k > 256
        self.scales = torch.tensor([(cfg.d_k ** -0.5) if s else 1.0 for s in scaled], dtype=torch.float64)
        self.causal = list(causal)

        def stack(get, transpose=False):
            t = torch.stack([get(m).detach() for m in models])
            return (t.transpose(-1, -2) if transpose else t).contiguous().requires_grad_(True)

        self.tok = stack(lambda m: m.tok_emb.weight)  # (C, V, D), tied with the head
        self.pos = stack(lambda m: m.pos_emb.weight)  # (C, block, D)
        self.layers = []
        for li in range(cfg.n_layer):
            def blk(m, li=li):
                return m.blocks[li]
            self.layers.append({
                "ln1_w": stack(lambda m: blk(m).ln_1.weight), "ln1_b": stack(lambda m: blk(m).ln_1.bias),
                "qkv": stack(lambda m: torch.cat([blk(m).attn.q.weight, blk(m).attn.k.weight, blk(m).attn.v.weight]),
                             transpose=True),  # (C, D, H*(2 d_k + d_v))
                "o": stack(lambda m: blk(m).attn.o.weight, transpose=True),  # (C, H*d_v, D)
                "ln2_w": stack(lambda m: blk(m).ln_2.weight), "ln2_b": stack(lambda m: blk(m).ln_2.bias),
                "fc": stack(lambda m: blk(m).mlp.fc.weight, transpose=True),  # (C, D, 4D)
                "fc_b": stack(lambda m: blk(m).mlp.fc.bias),
                "proj": stack(lambda m: blk(m).mlp.proj.weight, transpose=True),  # (C, 4D, D)
                "proj_b": stack(lambda m: blk(m).mlp.proj.bias)})
        self.lnf_w, self.lnf_b = stack(lambda m: m.ln_f.weight), stack(lambda m: m.ln_f.bias)

    def parameters(self) -> list[torch.Tensor]:
        return [self.tok, self.pos, *(t for layer in self.layers for t in layer.values()), self.lnf_w, self.lnf_b]

    def to(self, device):
        for t in self.parameters():
            t.data = t.data.to(device)
        self.scales = self.scales.to(device)  # made before a CUDA graph's capture, which copies nothing from the host
        return self

    @staticmethod
    def _ln(x, w, b):
        """Per-cell LayerNorm: x (C, N, D), w and b (C, D)."""
        return torch.addcmul(b[:, None], F.layer_norm(x, x.shape[-1:]), w[:, None])

    def _attention(self, h, layer, B, T):
        """h (C, B*T, D) -> (C, B*T, H*d_v)."""
        C, H, d_k, d_v, D = self.C, self.H, self.d_k, self.d_v, self.D
        qkv = torch.bmm(h, layer["qkv"])  # (C, B*T, H*(2 d_k + d_v))
        q, k, v = qkv.split([H * d_k, H * d_k, H * d_v], dim=-1)
        v = v.view(C, B, T, H, d_v).transpose(2, 3)  # (C, B, H, T, d_v)
        scale = self.scales.to(qkv.dtype).view(C, 1, 1, 1, 1)  # under autocast the GEMMs' dtype
        if self.bilinear:  # q_i . k_j = x_i (W_q,h^T W_k,h) x_j^T: a (D, D) form per cell and head
            w_q = layer["qkv"][..., : H * d_k].reshape(C, D, H, d_k).permute(0, 2, 1, 3)  # (C, H, D, d_k)
            w_k = layer["qkv"][..., H * d_k: 2 * H * d_k].reshape(C, D, H, d_k).permute(0, 2, 3, 1)  # (C, H, d_k, D)
            form = torch.matmul(w_q, w_k)  # (C, H, D, D)
            x = h.to(qkv.dtype).view(C, 1, B * T, D)
            left = torch.matmul(x, form.to(qkv.dtype)).view(C, H, B, T, D).transpose(1, 2)  # (C, B, H, T, D)
            q, k = left * scale, x.view(C, B, 1, T, D).expand(C, B, H, T, D)
        else:
            q = q.view(C, B, T, H, d_k).transpose(2, 3) * scale  # (C, B, H, T, d_k)
            k = k.view(C, B, T, H, d_k).transpose(2, 3)
        outs = []
        for c in range(C):  # one SDPA call per cell: is_causal is one flag per call
            outs.append(F.scaled_dot_product_attention(q[c], k[c], v[c], is_causal=self.causal[c], scale=1.0))
        out = torch.stack(outs)  # (C, B, H, T, d_v)
        return out.transpose(2, 3).reshape(C, B * T, H * d_v)

    def loss(self, idx, targets):
        """idx, targets (C, B, T) -> (C,) mean cross-entropy of each cell."""
        C, B, T = idx.shape
        V = self.tok.size(1)
        flat = (idx + torch.arange(C, device=idx.device).view(C, 1, 1) * V).view(-1)
        x = self.tok.reshape(C * V, -1)[flat].view(C, B * T, -1)  # (C, B*T, D)
        x = (x.view(C, B, T, -1) + self.pos[:, None, :T]).view(C, B * T, -1)
        for layer in self.layers:
            x = x + torch.bmm(self._attention(self._ln(x, layer["ln1_w"], layer["ln1_b"]), layer, B, T), layer["o"])
            h = torch.baddbmm(layer["fc_b"][:, None], self._ln(x, layer["ln2_w"], layer["ln2_b"]), layer["fc"])
            x = x + torch.baddbmm(layer["proj_b"][:, None], F.gelu(h, approximate="tanh"), layer["proj"])
        x = self._ln(x, self.lnf_w, self.lnf_b)
        logits = torch.bmm(x, self.tok.transpose(1, 2))  # (C, B*T, V)
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # float32 at least, as the model's
        per_token = F.cross_entropy(wide.reshape(-1, V), targets.reshape(-1), reduction="none")
        return per_token.view(C, -1).mean(-1)


def stacked_step(cells: StackedCells, optimizer, idx, targets, grad_clip: float, autocast):
    """Forward, backward, each cell's global gradient norm and clip, one AdamW update; returns (C,) losses."""
    with autocast():
        losses = cells.loss(idx, targets)
    losses.sum().backward()  # cells share no parameter: each cell's gradients are its own loss's
    params = cells.parameters()
    squares = torch.stack([p.grad.float().pow(2).flatten(1).sum(1) for p in params])  # (P, C)
    norms = squares.sum(0).sqrt()  # (C,)
    if grad_clip > 0:
        coef = (grad_clip / (norms + 1e-6)).clamp(max=1.0)
        for p in params:
            p.grad.mul_(coef.view(-1, *([1] * (p.dim() - 1))).to(p.grad.dtype))
    optimizer.step()
    return losses.detach(), norms


def grid_models(d_k: int, smoke: bool, device, count: int):
    from andrea_exp.model.decoder import Andrea, ModelConfig

    shape = dict(d_model=32, n_layer=1, n_head=2, d_v=8, block_size=16, vocab_size=16) if smoke else \
        dict(d_model=256, n_layer=4, n_head=4, d_v=64, block_size=256, vocab_size=32)
    models, scaled, causal = [], [], []
    for i in range(count):
        s, c = VARIANTS[i % len(VARIANTS)]
        torch.manual_seed(i)
        models.append(Andrea(ModelConfig(d_k=d_k, scale="sqrt" if s else "none", causal=c, loss_impl="plain",
                                          **shape)).to(device))
        scaled.append(s)
        causal.append(c)
    return models, scaled, causal


def check_losses(d_k: int, smoke: bool) -> dict:
    """Largest |stacked - model's own| over the four variants of the losses and, relative to the largest
    entry, of the q/k/v and MLP weight gradients; float64 weights on the CPU (the model's plain loss is
    computed in float32, so agreement is to float32 rounding)."""
    models, scaled, causal = grid_models(d_k, smoke, "cpu", 4)
    for m in models:
        m.double()
    cells = StackedCells(models, scaled, causal)
    T = 8 if smoke else 32
    idx = torch.randint(0, models[0].cfg.vocab_size, (4, 2, T + 1), generator=torch.Generator().manual_seed(0))
    stacked = cells.loss(idx[..., :-1], idx[..., 1:])
    stacked.sum().backward()
    own = torch.stack([m(idx[c, :, :-1], idx[c, :, 1:])[1] for c, m in enumerate(models)])
    own.sum().backward()
    grad_diff = 0.0
    for li, layer in enumerate(cells.layers):
        for c, m in enumerate(models):
            attn, mlp = m.blocks[li].attn, m.blocks[li].mlp
            mine = {"qkv": torch.cat([attn.q.weight.grad, attn.k.weight.grad, attn.v.weight.grad]).T,
                    "fc": mlp.fc.weight.grad.T}
            for name, want in mine.items():
                got = layer[name].grad[c]
                grad_diff = max(grad_diff, float((got - want).abs().max() / want.abs().max()))
    return {"loss": float((stacked - own).abs().max().detach()), "grad_relative": grad_diff}


def time_stacked(d_k: int, count: int, steps: int, device, profile: bool = False) -> tuple[float, dict | None]:
    """(ms per step, `profiled` of 10 more steps or None) of `count` cells as one CUDA-graphed stacked step
    (B 32, T 128, bf16 autocast)."""
    models, scaled, causal = grid_models(d_k, False, device, count)
    cells = StackedCells(models, scaled, causal).to(device)
    del models
    optimizer = torch.optim.AdamW(cells.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True,
                                  capturable=True)
    idx = torch.randint(0, 32, (count, 32, 129), device=device)
    x, y = idx[..., :-1].contiguous(), idx[..., 1:].contiguous()

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            stacked_step(cells, optimizer, x, y, 1.0, autocast)
    torch.cuda.current_stream().wait_stream(side)
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stacked_step(cells, optimizer, x, y, 1.0, autocast)
    for _ in range(10):
        graph.replay()
    ms = timed(graph.replay, steps, torch.cuda.synchronize) * 1e3
    return ms, profiled(graph.replay, 10) if profile else None


def profiled(run_step, steps: int) -> dict:
    """Kernels of `steps` calls of run_step: kernels and kernel ms per step, and the busiest kernels. Kernel
    ms close to the wall time per step: the GPU is busy with work; far below it: it waits between kernels."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run_step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time_total for e in kernels)
    top = sorted(kernels, key=lambda e: e.device_time_total, reverse=True)[:8]
    return {"kernels_per_step": round(sum(e.count for e in kernels) / steps, 1),
            "kernel_ms_per_step": round(total_us / steps / 1e3, 3),
            "top": [{"name": e.key[:90], "us_per_step": round(e.device_time_total / steps, 1),
                     "calls_per_step": round(e.count / steps, 1)} for e in top]}


def time_package_cell(d_k: int, steps: int, profile: bool = False) -> tuple[float, dict | None]:
    """(ms per step, `profiled` of 10 more steps or None) of one cell as train() builds its step (the
    package's model, CUDA-graphed), in the same process."""
    from benchmarks.claims_grid_speed import cell_overrides
    from benchmarks.common import compose_cfg, warmed_cell

    cell, batches = warmed_cell(compose_cfg(cell_overrides(d_k, False)), 1 + steps + 10)
    batch = iter(batches)  # a fresh batch every step, as in training

    def one_step():
        cell.step(*next(batch))

    ms = timed(one_step, steps, torch.cuda.synchronize) * 1e3
    return ms, profiled(one_step, 10) if profile else None


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-k", type=int, nargs="+", default=[64, 256, 4096])
    parser.add_argument("--cells", type=int, nargs="+", default=[1, 4, 12])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="the CPU loss check only")
    parser.add_argument("--profile", action="store_true", help="kernel profiles instead of timings alone")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result = {"commit": git_commit(), "check_vs_models": {d: check_losses(d, True) for d in (8, 64, 512)}}
    if not args.smoke:
        result["gpu"] = torch.cuda.get_device_name()
        result["ms_per_step"] = {}
        for d_k in args.d_k:
            ms, prof = time_package_cell(d_k, args.steps, args.profile)
            if prof is not None:
                result.setdefault("profiles", {})[f"d_k={d_k} package cell"] = prof
            result["ms_per_step"][f"d_k={d_k} package cell"] = {"ms": round(ms, 3), "ms_per_cell": round(ms, 3)}
            print(f"[stacked] d_k {d_k}, the package's own graphed step: {ms:.3f} ms", flush=True)
            for count in args.cells:
                ms, prof = time_stacked(d_k, count, args.steps, torch.device("cuda"), args.profile)
                if prof is not None:
                    result["profiles"][f"d_k={d_k} cells={count}"] = prof
                result["ms_per_step"][f"d_k={d_k} cells={count}"] = {"ms": round(ms, 3),
                                                                      "ms_per_cell": round(ms / count, 3)}
                print(f"[stacked] d_k {d_k}, {count} cells: {ms:.3f} ms a step, {ms / count:.3f} ms a cell",
                      flush=True)
    print(json.dumps(result, indent=1))
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
