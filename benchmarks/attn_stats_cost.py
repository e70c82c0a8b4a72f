"""What train.attn_stats costs: ANDREA-120M and claims-grid cells with and without the statistics, A/B in one process.

ANDREA-120M (B 32, T 1024, vocabulary 50304, compiled and captured with clipping and AdamW as one CUDA graph:
the step train() builds, as benchmarks/throughput.py runs it; no probe) as three fresh models from one seed on
the same batches: attn_stats=off, every step, and every 10th step (train.attn_stats_every=10). They are timed in
rotation, one window of --window steps each per pair (the order rotates pair by pair), each window with the
loop's host work: one host sync per train.log_every steps and the attn_step/* rows built on the host, as
train() does. Reported: each arm's tokens/s per pair, the ratio t_off / t_arm per pair and its median, the cost
100 (1 - ratio) %, against the target (2%) and the goal (1%); the statistics kernels' own GPU time per step from
the profiler; each arm's losses against the off arm's (the statistics must not change training); the last
logged values.

The loss comparison needs the arms to start alike, and a yardstick. The process's first compiled model does
work no later one repeats (the first torch.compile, the first capture, inductor's first-call tuning of the
kernels every later model of that graph reuses, the chunked loss's compiled step): so before any measured arm
a throwaway model of each graph (off, and with the statistics) is built, warmed through its compilation and
capture and dropped, and the measured arms are then built one after another from one seed, each the same way.
A `control` arm, a second off arm built last and stepped untimed to the same step, gives the run-to-run
difference of two identical arms: `losses_vs_off` holds every arm's difference, the control's included, and
`losses` every arm's loss at every step, so a difference can be placed (which steps, which arms).

Claims-grid cells (andrea_small, T 128, B 32, d_k 64 on the fused path and d_k 4096 on the bilinear one, graphed,
not compiled): ms per step with and without the statistics, A/B pairs.

The kernel alone at the 120M layer shape (B 32, H 12, T 1024, d_k 64, bf16, causal) against SDPA's forward.

    PYTHONPATH=. python3 benchmarks/attn_stats_cost.py --out benchmarks/results/attn_stats_h200.json   # H200: ~3 min
    PYTHONPATH=. python3 benchmarks/attn_stats_cost.py --smoke --out /tmp/attn_stats_smoke.json       # CPU, seconds
    PYTHONPATH=. python3 benchmarks/attn_stats_cost.py --smoke --device cuda --out /tmp/attn_stats_smoke.json
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from pathlib import Path

import torch

from andrea_exp.instruments import attn_stats
from andrea_exp.runs import metric_keys as K
from benchmarks.claims_grid_speed import cell_overrides
from benchmarks.common import CellRun, compose_cfg, git_commit, timed
from benchmarks.throughput import Result, andrea_overrides, sync, timed_window

TARGET_COST_PCT, GOAL_COST_PCT = 2.0, 1.0
ARMS = {"off": ["train.attn_stats=off"], "every": ["train.attn_stats=every", "train.attn_stats_pass=fused"],
        "every10": ["train.attn_stats=every", "train.attn_stats_every=10", "train.attn_stats_pass=fused"],
        "every_separate": ["train.attn_stats=every", "train.attn_stats_pass=separate"],
        "every10_separate": ["train.attn_stats=every", "train.attn_stats_every=10", "train.attn_stats_pass=separate"]}
GRAPH_OF = {"off": "off", "every": "every", "every10": "every", "every_separate": "every_separate",
            "every10_separate": "every_separate"}  # the arms that compile to one graph
STATS_KERNELS = ("_row_block_stats", "_finish_heads", "_attn_fwd_stats")
CONTROL = "control"  # a second off arm, built last: the difference two identical arms show
FIRST_LOSSES = 20  # steps whose losses are compared on their own (compilation, capture, the first replays)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, on the CPU without compile (for tests)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default cuda, with --smoke cpu (cuda: compiled and graphed, and the kernel alone)")
    parser.add_argument("--pairs", type=int, default=4, help="rotations of timed windows, ANDREA-120M")
    parser.add_argument("--window", type=int, default=50, help="steps per timed window, ANDREA-120M")
    parser.add_argument("--warmup-steps", type=int, default=8, help="untimed steps per arm after compilation")
    parser.add_argument("--cell-pairs", type=int, default=5, help="A/B pairs per claims-grid cell")
    parser.add_argument("--cell-window", type=int, default=200, help="steps per timed window, claims-grid cells")
    parser.add_argument("--arms", default="off,every,every10,every_separate",
                        help=f"ANDREA-120M arms, of {', '.join(ARMS)}")
    parser.add_argument("--budget-s", type=float, default=260.0, help="skip the claims-grid cells past this")
    parser.add_argument("--out", type=Path, required=True, help="JSON result")
    args = parser.parse_args(argv)
    args.arms = [a for a in args.arms.split(",") if a]
    if "off" not in args.arms or any(a not in ARMS for a in args.arms):
        parser.error(f"--arms must include off and name only {', '.join(ARMS)}")
    if args.smoke:
        args.pairs, args.window, args.warmup_steps = min(args.pairs, 2), 4, 2
        args.cell_pairs, args.cell_window = min(args.cell_pairs, 2), 4
    if args.device is None:
        args.device = "cpu" if args.smoke else "cuda"
    return args


def stats_kernel_ms(arm: CellRun, steps: int, device: torch.device) -> dict:
    """GPU time per step of all kernels and of the statistics kernels (names in STATS_KERNELS), from the profiler."""
    activity = torch.profiler.ProfilerActivity.CUDA if device.type == "cuda" else torch.profiler.ProfilerActivity.CPU
    sync(device)
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(steps):
            arm.step()
        sync(device)
    total = stats = 0.0
    for event in prof.key_averages():
        us = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        total += us
        if any(name in event.key for name in STATS_KERNELS):
            stats += us
    return {"all_kernels_ms_per_step": total / 1e3 / steps, "stats_kernels_ms_per_step": stats / 1e3 / steps}


def max_loss_diff(a: list[float], b: list[float], first: int | None = None) -> float | None:
    n = min(len(a), len(b), first or len(a))
    return max(abs(x - y) for x, y in zip(a[:n], b[:n])) if n else None


def loss_comparison(a: list[float], b: list[float]) -> dict:
    """Two arms' losses step by step: the largest difference, over all steps, the first 10 and the first
    FIRST_LOSSES, and the first step at which they differ at all (None: bitwise equal)."""
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None)
    return {"max_abs_diff": max_loss_diff(a, b), "max_abs_diff_first_10_steps": max_loss_diff(a, b, 10),
            f"max_abs_diff_first_{FIRST_LOSSES}_steps": max_loss_diff(a, b, FIRST_LOSSES),
            "first_differing_step": first, "steps_compared": n}


def warm(arm: CellRun, steps: int) -> CellRun:
    for _ in range(steps):
        arm.step()
    arm.flush()
    sync(arm.cell.rt.device)
    return arm


def release() -> None:
    """Free what the dropped models held (their CUDA graphs' pools included): call after the last reference went."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def andrea_120m(args, result: Result, say) -> None:
    shape = argparse.Namespace(batch_size=32, seq_len=1024, vocab=50304, compile_mode="default", smoke=args.smoke,
                               device=args.device)
    if args.smoke:
        shape.batch_size, shape.seq_len, shape.vocab = 4, 32, 128
    base = andrea_overrides(shape) + ["probe.every=0"]
    warmup = 3 + args.warmup_steps  # compilation (3 eager steps), the capture, then steady steps
    # throwaway models first, one per graph (every10's is every's), so that no measured arm is the process's
    # first of its graph: each then starts from the same process state (see the module docstring)
    throwaway = list(dict.fromkeys(GRAPH_OF[name] for name in ["off", *args.arms]))
    for name in throwaway:
        t0 = time.perf_counter()
        graphed = warm(CellRun(compose_cfg(base + ARMS[name])), warmup).cell.graphed
        release()
        say(f"throwaway {name} model: built, warmed and dropped in {time.perf_counter() - t0:.1f} s, graphed {graphed}")
    arms = {}
    for name in args.arms:
        t0 = time.perf_counter()
        arms[name] = warm(CellRun(compose_cfg(base + ARMS[name])), warmup)
        say(f"ANDREA arm {name}: built and warmed in {time.perf_counter() - t0:.1f} s, "
            f"graphed {arms[name].cell.graphed}")
    control = warm(CellRun(compose_cfg(base + ARMS["off"])), warmup)  # built last; not timed
    device = arms["off"].cell.rt.device
    result.update(andrea_overrides=base, arms={name: ARMS[name] for name in arms}, window_steps=args.window,
                  throwaway_models=throwaway, control_arm=f"{CONTROL}: {ARMS['off']}, built after the others, untimed",
                  graphed={**{name: arm.cell.graphed for name, arm in arms.items()}, CONTROL: control.cell.graphed})
    for arm in arms.values():  # every arm at the same step, a multiple of every cadence
        while arm.step_no % 10:
            arm.step()
        arm.flush()
    tokens = shape.batch_size * shape.seq_len * args.window
    names, pairs = list(arms), []
    for p in range(args.pairs):
        order = names[p % len(names):] + names[: p % len(names)]
        seconds = {name: timed_window(arms[name], args.window, device) for name in order}
        pair = {"order": order, **{f"{name}_tokens_per_s": tokens / seconds[name] for name in names},
                **{f"ratio_{name}": seconds["off"] / seconds[name] for name in names if name != "off"}}
        pairs.append(pair)
        say(f"pair {p}: " + ", ".join(f"{name} {tokens / seconds[name]:,.0f} tok/s" for name in names)
            + "; " + ", ".join(f"{k} {v:.4f}" for k, v in pair.items() if k.startswith("ratio_")))
        result.update(pairs=pairs)
    summary = {}
    for name in names:
        if name == "off":
            continue
        ratio = statistics.median(p[f"ratio_{name}"] for p in pairs)
        summary[name] = {"median_ratio": ratio, "cost_pct": 100 * (1 - ratio),
                         "cost_pct_per_pair": [100 * (1 - p[f"ratio_{name}"]) for p in pairs],
                         "target_met": 100 * (1 - ratio) <= TARGET_COST_PCT,
                         "goal_met": 100 * (1 - ratio) <= GOAL_COST_PCT}
    tps = {name: statistics.median(p[f"{name}_tokens_per_s"] for p in pairs) for name in names}
    for arm in arms.values():
        arm.flush()
    while control.step_no < arms["off"].step_no:
        control.step()
    control.flush()
    trained = {**arms, CONTROL: control}
    losses = {name: loss_comparison(arm.losses, arms["off"].losses) for name, arm in trained.items() if name != "off"}
    between = {"every10_vs_every": loss_comparison(arms["every10"].losses, arms["every"].losses)} \
        if "every" in arms and "every10" in arms else {}
    result.update(median_tokens_per_s=tps, cost=summary, losses_vs_off=losses, losses_between_arms=between,
                  losses={name: arm.losses for name, arm in trained.items()},
                  last_logged_stats={name: {k: v for k, v in arms[name].last_row.items()
                                            if k == "step" or "/L" not in k} for name in names if name != "off"})
    for name, s in summary.items():
        say(f"{name}: median ratio {s['median_ratio']:.4f}, cost {s['cost_pct']:.2f}% (target {TARGET_COST_PCT}%, "
            f"goal {GOAL_COST_PCT}%); losses vs off: max diff {losses[name]['max_abs_diff']}, first differing step "
            f"{losses[name]['first_differing_step']}")
    say(f"{CONTROL} (a second off arm): losses vs off: max diff {losses[CONTROL]['max_abs_diff']}, first "
        f"differing step {losses[CONTROL]['first_differing_step']}")
    profiles = {name: stats_kernel_ms(arms[name], 3 if not args.smoke else 1, device) for name in names}
    result.update(profile=profiles)
    say("profile (ms per step): " + ", ".join(
        f"{name} all {p['all_kernels_ms_per_step']:.2f} / stats {p['stats_kernels_ms_per_step']:.3f}"
        for name, p in profiles.items()))


def claims_cells(args, result: Result, say) -> None:
    cells = {}
    for d_k in (64, 4096):
        arms = {}
        for name in ("off", "every"):
            arm = CellRun(compose_cfg(cell_overrides(d_k, args.smoke, args.device) + ["train.progress=false"]
                                      + ARMS[name]))
            for _ in range(3 + args.warmup_steps):
                arm.step()
            arms[name] = arm
            del arm
        device = arms["off"].cell.rt.device
        pairs = []
        for p in range(args.cell_pairs):
            order = ["off", "every"] if p % 2 == 0 else ["every", "off"]
            seconds = {name: timed_window(arms[name], args.cell_window, device) for name in order}
            pairs.append({name: 1e3 * seconds[name] / args.cell_window for name in ("off", "every")})
        off = statistics.median(p["off"] for p in pairs)
        every = statistics.median(p["every"] for p in pairs)
        cells[str(d_k)] = {"attn_impl": arms["every"].cell.model.blocks[0].attn.impl,
                           "graphed": arms["every"].cell.graphed,
                           "ms_per_step_pairs": pairs, "off_ms": off, "every_ms": every,
                           "cost_pct": 100 * (every - off) / off}
        say(f"claims-grid cell d_k {d_k} ({cells[str(d_k)]['attn_impl']}): off {off:.3f} ms, every {every:.3f} ms "
            f"a step ({cells[str(d_k)]['cost_pct']:+.1f}%)")
        result.update(claims_grid_cells=cells)
        arms.clear()
        release()


def kernel_alone(args, result: Result, say) -> None:
    """At one 120M layer's shape: the statistics-only pass, the fused pass (attention and statistics) forward and
    forward + backward, against SDPA's forward and forward + backward at the same shape; the fused pass's output
    and gradients against SDPA's, and its statistics against the explicit pipeline in float64."""
    if args.device != "cuda":
        return
    from torch.nn import functional as F

    from andrea_exp.model.step_stats import SATURATION, cudnn_backward_fits
    from andrea_exp.model.step_stats_kernel import launch_config

    B, H, T, d = 4 if args.smoke else 32, 12, 1024, 64
    scale = d ** -0.5
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(B, T, 3, H, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = (qkv[:, :, i].transpose(1, 2).requires_grad_() for i in range(3))  # (B, H, T, d) views, as the model's
    grad = torch.randn(B, T, H, d, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(1, 2)
    flag = torch.ones(1, dtype=torch.int32, device="cuda")
    cudnn = cudnn_backward_fits("auto", q.device)  # the backward the model's fused pass takes here (T % 64 == 0)

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    def fused():
        return torch.ops.andrea_exp.attn_fwd_stats(q, k, v, flag, scale, True, SATURATION, cudnn)[0]

    def forward_backward(fn):
        return lambda: torch.autograd.grad(fn(), (q, k, v), grad)

    sync = torch.cuda.synchronize
    ms = {"stats_only_pass": 1e3 * timed(lambda: attn_stats.head_stats(q, k, scale=scale, causal=True), 20, sync),
          "sdpa_forward": 1e3 * timed(sdpa, 20, sync), "fused_forward": 1e3 * timed(fused, 20, sync),
          "sdpa_forward_backward": 1e3 * timed(forward_backward(sdpa), 20, sync),
          "fused_forward_backward": 1e3 * timed(forward_backward(fused), 20, sync)}
    # the passes against SDPA (output, gradients) and the explicit pipeline in float64 (statistics), two sequences
    got_stats = attn_stats.head_stats(q[:2], k[:2], scale=scale, causal=True)
    fused_stats = torch.ops.andrea_exp.attn_fwd_stats(q[:2], k[:2], v[:2], flag, scale, True, SATURATION, cudnn)[2]
    ref = attn_stats.reference_head_stats(q[:2].double(), k[:2].double(), scale=scale, causal=True)

    def rel_err(got):
        return {name: ((g - r).abs() / (1 + r.abs())).max().item() for name, g, r in zip(attn_stats.STATS, got, ref)}

    two = [t[:2].detach().requires_grad_() for t in (q, k, v)]  # (2, H, T, d) each

    def explicit_float64(q2, k2, v2):
        future = torch.ones(T, T, dtype=torch.bool, device="cuda").triu(1)
        scores = (q2.double() @ k2.double().transpose(-2, -1) * scale).masked_fill(future, -math.inf)
        return torch.softmax(scores, -1) @ v2.double()  # (2, H, T, d)

    passes = {"sdpa": lambda q2, k2, v2: F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, scale=scale),
              "fused": lambda q2, k2, v2: torch.ops.andrea_exp.attn_fwd_stats(q2, k2, v2, flag, scale, True,
                                                                              SATURATION, cudnn)[0],
              "float64": explicit_float64}
    outs = {name: fn(*two) for name, fn in passes.items()}
    grads = {name: torch.autograd.grad(o, two, grad[:2].to(o.dtype)) for name, o in outs.items()}
    result.update(kernel_alone={
        "shape": [B, H, T, d], "ms": ms, "stats_only_ms_per_step_12_layers": 12 * ms["stats_only_pass"],
        "fused_extra_ms_per_step_12_layers": 12 * (ms["fused_forward_backward"] - ms["sdpa_forward_backward"]),
        "stats_only_launch_config": launch_config(d, q.dtype), "fused_pass_backward": "cudnn" if cudnn else "flash",
        "max_rel_err_vs_explicit_float64": {"stats_only_pass": rel_err(got_stats), "fused_pass": rel_err(fused_stats)},
        "output_max_abs_err_vs_float64": {name: (outs[name].double() - outs["float64"]).abs().max().item()
                                          for name in ("sdpa", "fused")},
        "grad_max_abs_err_vs_float64": {name: {t: (g.double() - r).abs().max().item()
                                               for t, g, r in zip("qkv", grads[name], grads["float64"])}
                                        for name in ("sdpa", "fused")},
        "grad_max_abs_float64": {t: g.abs().max().item() for t, g in zip("qkv", grads["float64"])}})
    say(f"one layer, B {B} H {H} T {T} d {d}: " + ", ".join(f"{k_} {v_:.3f} ms" for k_, v_ in ms.items()))


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()

    def say(text: str) -> None:
        print(f"[attn-stats-cost {time.perf_counter() - started:6.1f}s] {text}", flush=True)

    argv_used = sys.argv[1:] if argv is None else list(argv)
    result = Result(args.out, {
        "command": "PYTHONPATH=. python3 benchmarks/attn_stats_cost.py " + " ".join(argv_used),
        "commit": git_commit(), "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "smoke": args.smoke, "target_cost_pct": TARGET_COST_PCT,
        "goal_cost_pct": GOAL_COST_PCT, "keys": sorted(attn_stats.KEYS.values()),
        "pooled_note": f"{K.ATTN_STEP}/score_max and max_prob_max: max over heads and layers; the rest: means"})
    kernel_alone(args, result, say)
    andrea_120m(args, result, say)
    release()  # the arms went with andrea_120m's frame
    if time.perf_counter() - started < args.budget_s:
        claims_cells(args, result, say)
    else:
        result.update(claims_grid_cells={"skipped": f"past --budget-s {args.budget_s:g}"})
    result.update(total_s=time.perf_counter() - started)
    say(f"wrote {args.out}")
    return result.data


if __name__ == "__main__":
    main()
