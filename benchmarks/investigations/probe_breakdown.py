"""Where one probe's time goes: Probe.measure() taken apart on its model's shapes (default ANDREA-120M, the probe
batch of conf/probe, T 1024, GPT-2's vocabulary), each part timed on its own, synchronised, in one process.

- measure: the whole Probe.measure(), as the train loop calls it;
- forward: the float32 captured forward alone (every layer's scores, pattern, q, k kept, nothing reduced);
- forward_backward: that forward and the parameters' gradients (torch.autograd.grad), nothing reduced;
- forward_stats: forward_layer_stats (head statistics, q/k spread, Jacobian rows) on one layer's captured tensors,
  times the layers;
- grad_stats: grad_layer_stats (d loss / d scores norm and row norms) on a (B, H, T, T) gradient, times the layers;
- pooling: the put_* steps on the per-layer reductions and the one host copy (qk_spectral included);
- qk_spectral: put_qk_spectral alone (part of pooling);
- unaccounted: measure less forward_backward, forward_stats, grad_stats and pooling (hooks, fork of the random
  streams, mode switches; negative where the parts overlap less on their own than inside the probe).
With --compiled (default on CUDA), forward_stats and grad_stats again with the two reductions compiled
(torch.compile fuses their passes over the (B, H, T, T) tensors): their times, the compile time, and the largest
difference of their values from the eager ones. With --profile, the CUDA kernels of one measure() by time. Prints a
line per part and writes JSON.

    PYTHONPATH=. python3 benchmarks/investigations/probe_breakdown.py --out /tmp/probe_breakdown.json [--profile]
    PYTHONPATH=. python3 benchmarks/investigations/probe_breakdown.py --smoke --out /tmp/x.json   # CPU, tiny
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from andrea_exp.instruments import probe as probes
from andrea_exp.training.cell import build_model
from andrea_exp.training.runtime import setup_runtime
from benchmarks.common import compose_cfg, git_commit, timed, write_result

PARTS = ("measure", "forward", "forward_backward", "forward_stats", "grad_stats", "pooling", "qk_spectral")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="andrea_tiny at T 32 on the CPU unless --device cuda")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default cuda, with --smoke cpu")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per part (after one untimed)")
    parser.add_argument("--profile", action="store_true", help="the CUDA kernels of one measure(), by time")
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=None,
                        help="also time the two per-layer reductions compiled (default: on CUDA)")
    parser.add_argument("--set", nargs="*", default=[], metavar="OVERRIDE",
                        help="extra Hydra overrides, e.g. probe.batch_size=4 model.qk_layernorm=true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.device = args.device or ("cpu" if args.smoke else "cuda")
    args.compiled = args.device == "cuda" if args.compiled is None else args.compiled
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible; use --smoke (CPU)")
    return args


def overrides(args) -> list[str]:
    shape = (["model=andrea_tiny", "data.seq_len=32", "data.vocab_size=128"] if args.smoke else
             ["model=andrea_120m", "data.seq_len=1024", "model.block_size=1024", "data.vocab_size=50304"])
    return [*shape, f"train.device={args.device}", "logger.mode=disabled", *args.set]


def captured_forward(probe, x, y):
    """The probe's forward as measure() runs it, with every layer's stages kept: (loss, stages)."""
    with probe._instrumented() as stages, torch.enable_grad(), \
            torch.autocast(device_type=x.device.type, enabled=False):
        _, loss = probe.model(x, y)
        return loss, [dict(stage) for stage in stages]


def main(argv=None) -> dict:
    args = parse_args(argv)
    cfg = compose_cfg(overrides(args))
    rt = setup_runtime(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg, cfg.data.vocab_size).to(rt.device)
    T, B = cfg.data.seq_len, cfg.probe.batch_size
    tokens = torch.randint(0, cfg.data.vocab_size, (B, T + 1), device=rt.device)
    sync = torch.cuda.synchronize if rt.device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as run_dir:
        probe = probes.Probe(model, tokens, cfg.probe, Path(run_dir))
        x, y = tokens[:, :-1], tokens[:, 1:]
        first = probes.first_kept_row(T, T, cfg.model.causal)
        loss, stages = captured_forward(probe, x, y)
        layer0 = stages[0]
        grads = torch.autograd.grad(loss, probe.params, allow_unused=True)
        param_grads = [torch.zeros_like(p) if g is None else g for p, g in zip(probe.params, grads)]
        score_grad = torch.randn_like(layer0["scores"].detach())
        forward = [probes.forward_layer_stats(layer0["scores"], layer0["pattern"], layer0["q"], layer0["k"], first,
                                              cfg.model.causal, probe.dead_jac)] * probe.n_layer
        backward = [probes.grad_layer_stats(score_grad, first)] * probe.n_layer
        del loss, stages, grads

        def forward_backward():
            loss, _ = captured_forward(probe, x, y)
            torch.autograd.grad(loss, probe.params, allow_unused=True)

        def forward_stats():
            for _ in range(probe.n_layer):
                probes.forward_layer_stats(layer0["scores"], layer0["pattern"], layer0["q"], layer0["k"], first,
                                           cfg.model.causal, probe.dead_jac)

        def grad_stats():
            for _ in range(probe.n_layer):
                probes.grad_layer_stats(score_grad, first)

        def pooling():
            sheet = probes.MetricSheet()
            probes.put_attention_stats(sheet, forward, probe.per_head)
            probes.put_score_grads(sheet, backward)
            probes.put_param_grads(sheet, probe.group_names, probe.membership, param_grads)
            probes.put_jacobian_rows(sheet, forward)
            probes.put_gradient_rows(sheet, torch.stack([layer["rows"] for layer in backward]), probe.dead_grad)
            probes.put_qk_spectral(sheet, model)
            return sheet.to_host()

        parts = {"measure": lambda: probe.measure(0), "forward": lambda: captured_forward(probe, x, y),
                 "forward_backward": forward_backward, "forward_stats": forward_stats, "grad_stats": grad_stats,
                 "pooling": pooling, "qk_spectral": lambda: probes.put_qk_spectral(probes.MetricSheet(), model)}
        ms = {name: 1000 * timed(parts[name], args.repeats, sync) for name in PARTS}
        kernels = profile_kernels(probe) if args.profile and rt.device.type == "cuda" else None
        compiled = (compiled_reductions(layer0, score_grad, first, cfg.model.causal, probe, args.repeats, sync)
                    if args.compiled else None)
    ms["unaccounted"] = ms["measure"] - sum(ms[p] for p in ("forward_backward", "forward_stats", "grad_stats",
                                                           "pooling"))
    for name, value in ms.items():
        print(f"{name:>17}: {value:9.2f} ms  ({value / ms['measure']:6.1%} of measure)", flush=True)
    if compiled is not None:
        print(f"compiled reductions: {compiled}", flush=True)
    result = {"command": "PYTHONPATH=. python3 benchmarks/investigations/probe_breakdown.py "
                         + " ".join(argv if argv is not None else []),
              "commit": git_commit(), "device": torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda"
              else "cpu", "torch": torch.__version__, "smoke": args.smoke, "overrides": overrides(args),
              "batch_size": B, "seq_len": T, "n_layer": probe.n_layer, "n_head": probe.n_head,
              "repeats": args.repeats, "ms": ms, "compiled": compiled, "kernels": kernels}
    write_result(args.out, result)
    return json.loads(json.dumps(result))


def compiled_reductions(layer, score_grad, first: int, causal: bool, probe, repeats: int, sync) -> dict:
    """forward_layer_stats and grad_layer_stats compiled, on the same tensors: ms for the layers, the first call's
    seconds (compilation), and the largest absolute difference of every value from the eager reduction's."""
    import time

    fwd, grad = torch.compile(probes.forward_layer_stats), torch.compile(probes.grad_layer_stats)
    args = (layer["scores"], layer["pattern"], layer["q"], layer["k"], first, causal, probe.dead_jac)
    started = time.perf_counter()
    got = {"forward": fwd(*args), "grad": grad(score_grad, first)}
    sync()
    compile_s = time.perf_counter() - started
    want = {"forward": probes.forward_layer_stats(*args), "grad": probes.grad_layer_stats(score_grad, first)}

    def leaves(tree):
        if isinstance(tree, dict):
            return [x for key in sorted(tree) if key != "shape" for x in leaves(tree[key])]
        return [tree.float().reshape(-1)]

    diff = {name: max((a - b).abs().max().item() for a, b in zip(leaves(got[name]), leaves(want[name])))
            for name in got}

    def forward_stats():
        for _ in range(probe.n_layer):
            fwd(*args)

    def grad_stats():
        for _ in range(probe.n_layer):
            grad(score_grad, first)

    return {"forward_stats_ms": 1000 * timed(forward_stats, repeats, sync),
            "grad_stats_ms": 1000 * timed(grad_stats, repeats, sync), "compile_s": compile_s,
            "max_abs_diff_from_eager": diff}


def profile_kernels(probe, top: int = 15) -> list[dict]:
    """The CUDA kernels of one Probe.measure(), the longest first: name, ms, calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        probe.measure(0)
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: e.device_time_total, reverse=True)[:top]
    return [{"name": e.key[:120], "ms": e.device_time_total / 1000, "calls": e.count} for e in rows]


if __name__ == "__main__":
    main()
