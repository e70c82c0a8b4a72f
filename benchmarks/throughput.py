"""ANDREA-120M against a plain GPT-2-124M (benchmarks/reference_gpt.py, or nanoGPT's own model.py with --nanogpt),
side by side in one process.

Both models are built, compiled and warmed, then timed in alternation A/B/A/B: each pair is one window
of --window steps of the reference and one of ANDREA, on the same batches. ANDREA runs andrea_exp's
own pieces: the step train() builds (build_step: forward, backward, clipping and AdamW with its
schedule, captured as one CUDA graph where train.cuda_graph allows) and Probe at conf/probe's cadence;
a window of probe.every steps holds exactly one probe, so every pair pays the probe's cost.
Peak memory is measured per model in its own phase (its parameters and optimiser state plus what its
warm-up and first steps allocate above that; a captured graph allocates its memory while it is
captured, in the warm-up), for ANDREA split into training steps and a probe. Also: a short timing of each
SDPA kernel at the model's attention shape, and ablations (--variant) of the fast paths.

    PYTHONPATH=. python3 benchmarks/throughput.py                   # H200: about 3-4 minutes
    PYTHONPATH=. python3 benchmarks/throughput.py --smoke           # tiny shapes on CPU, seconds
    PYTHONPATH=. python3 benchmarks/throughput.py --smoke --device cuda  # tiny shapes, compiled and graphed
    git clone https://github.com/karpathy/nanoGPT /tmp/nanoGPT            # the reference as nanoGPT trains it:
    PYTHONPATH=. python3 benchmarks/throughput.py --nanogpt /tmp/nanoGPT/model.py --override train.attn_stats=every

With --nanogpt the reference is nanoGPT's GPT from that file, built as its train.py builds GPT-2-124M from scratch
(no bias, no dropout, the same vocabulary, T and batch), trained with its own configure_optimizers (fused AdamW on
CUDA) under the same bf16 autocast and torch.compile; the JSON then also holds nanogpt_tokens_per_s,
andrea_tokens_per_s and ratio_vs_nanogpt, and the file's SHA-256.

The same ANDREA-120M step with the training batch's attention statistics (train.attn_stats=every, and every
10th step) against it without them, A/B in one process: benchmarks/attn_stats_cost.py (built on this file's pieces).

"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.util
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from andrea_exp.model.attention import SDPA_BACKENDS, fused_attention
from andrea_exp.training.graphed_step import WARMUP_STEPS
from benchmarks.common import CellRun, compose_cfg, git_commit, timed
from benchmarks.reference_gpt import GPT, GPTConfig

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "throughput_h200.json"
TARGET_RATIO, GOAL_RATIO = 1.05, 1.10
COMPILE_STEPS = WARMUP_STEPS  # the graphed step's eager warm-up, where a compiled model compiles
DEFAULT_VARIANTS = ("model.loss_impl=plain", "model.fused_qkv=false")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, on the CPU without compile (for tests)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="where both models train: default cuda, with --smoke cpu (cuda: compiled and graphed)")
    parser.add_argument("--pairs", type=int, default=4, help="A/B pairs of timed windows")
    parser.add_argument("--window", type=int, default=None, help="steps per timed window; default probe.every")
    parser.add_argument("--warmup-steps", type=int, default=8,
                        help="untimed steps per model after the first 3 (which compile)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--compile-mode", default="default",
                        help="torch.compile mode for both models (default, max-autotune-no-cudagraphs, ...); "
                             "ANDREA's alone: --override train.compile_mode=...")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="Hydra override for ANDREA's headline run (repeatable), e.g. model.sdpa_backend=cudnn")
    parser.add_argument("--variant", action="append", default=None, metavar="K=V[,K=V]",
                        help=f"an ablation timed against the reference after the headline (repeatable); "
                             f"default {' and '.join(DEFAULT_VARIANTS)}; 'none' for none")
    parser.add_argument("--nanogpt", type=Path, default=None, metavar="MODEL_PY",
                        help="nanoGPT's model.py: the reference is its GPT (GPT-2-124M as its train.py builds it)")
    parser.add_argument("--no-sdpa-sweep", action="store_true", help="skip the per-kernel attention timing")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after warm-up, the CUDA kernels of this many steps of each model (no probe), by time")
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="skip ablations that would end after this many seconds from the start")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON result (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    if args.variant is None:
        args.variant = [] if args.smoke else list(DEFAULT_VARIANTS)
    args.variant = [v for v in args.variant if v != "none"]
    if args.smoke:
        args.batch_size, args.seq_len, args.vocab = 4, 32, 128
        args.warmup_steps = min(args.warmup_steps, 2)
        args.pairs = min(args.pairs, 2)
    if args.device is None:
        args.device = "cpu" if args.smoke else "cuda"
    if args.out is None:
        args.out = Path(tempfile.gettempdir()) / "throughput_smoke.json" if args.smoke else DEFAULT_OUT
    if args.nanogpt is not None and not args.nanogpt.is_file():
        parser.error(f"--nanogpt: no file {args.nanogpt} (nanoGPT's model.py)")
    if args.pairs < 1 or args.warmup_steps < 1 or (args.window is not None and args.window < 1):
        parser.error("--pairs, --warmup-steps and --window must be >= 1")
    return args


def andrea_overrides(args) -> list[str]:
    common = [f"data.vocab_size={args.vocab}", "data.order=1", "data.branching=4", f"data.seq_len={args.seq_len}",
              f"model.block_size={args.seq_len}", f"data.train_sequences={8 * args.batch_size}",
              "data.eval_sequences=16", f"train.batch_size={args.batch_size}", "train.max_steps=100000",
              "logger.mode=disabled", "train.progress=false", f"train.compile_mode={args.compile_mode}"]
    # on CUDA the compiled model captured with clipping and AdamW as one graph (auto leaves a compiled model eager)
    device = ["train.device=cpu", "train.compile=false"] if args.device == "cpu" else \
        ["train.device=cuda", "train.compile=true", "train.cuda_graph=true"]
    if args.smoke:
        return ["model=andrea_tiny", *common, *device, "probe.every=3", "data.eval_sequences=8"]
    return ["model=andrea_120m", *common, *device]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_nanogpt(path: Path):
    """nanoGPT's model.py as a module (its GPT and GPTConfig), imported from the file a user cloned."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ReferenceRun:
    """The plain GPT-2 on the same batches: forward, backward, clip to norm 1, fused AdamW. With `nanogpt` (the
    module of nanoGPT's model.py) the model and its optimiser are nanoGPT's own."""

    def __init__(self, cfg, data, device: torch.device, autocast, compile_mode: str, compile_on: bool,
                 nanogpt=None):
        torch.manual_seed(cfg.seed)
        tc, mc = cfg.train, cfg.model
        if nanogpt is None:
            gpt = GPTConfig(vocab_size=data.vocab_size, block_size=cfg.data.seq_len, n_layer=mc.n_layer,
                            n_head=mc.n_head, d_model=mc.d_model)
            self.model = GPT(gpt).to(device)
            self.optimizer = self.model.optimizer(tc.lr, tc.weight_decay, (tc.beta1, tc.beta2),
                                                  fused=device.type == "cuda")
        else:  # as nanoGPT's train.py builds GPT-2-124M from scratch: no bias, no dropout
            gpt = nanogpt.GPTConfig(block_size=cfg.data.seq_len, vocab_size=data.vocab_size, n_layer=mc.n_layer,
                                    n_head=mc.n_head, n_embd=mc.d_model, dropout=0.0, bias=False)
            self.model = nanogpt.GPT(gpt).to(device)
            self.optimizer = self.model.configure_optimizers(tc.weight_decay, tc.lr, (tc.beta1, tc.beta2),
                                                             device.type)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.train_model = torch.compile(self.model, mode=compile_mode) if compile_on else self.model
        self.loss = self.train_model if nanogpt is None else self._nanogpt_loss
        self.data, self.autocast, self.batch_size, self.seed = data, autocast, tc.batch_size, cfg.seed
        self.log_every, self.step_no, self.window = tc.log_every, 0, []

    def _nanogpt_loss(self, x, y):
        """nanoGPT's forward gives (logits, loss); its loader hands it contiguous batches (its loss uses .view)."""
        return self.train_model(x.contiguous(), y.contiguous())[1]

    def step(self, with_probe: bool = True) -> None:
        x, y = self.data.batch(self.step_no, self.batch_size, self.seed)
        with self.autocast():
            loss = self.loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.window.append(loss.detach())
        self.step_no += 1
        if len(self.window) >= self.log_every:  # the same host sync cadence as ANDREA's loop
            torch.stack(self.window).tolist()
            self.window = []


def timed_window(run, steps: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        run.step()
    sync(device)
    return time.perf_counter() - t0


def resident_bytes(model, optimizer) -> int:
    """A model's own lasting memory: its parameters and its optimiser's state."""
    tensors = list(model.parameters()) + [t for st in optimizer.state.values() for t in st.values()
                                          if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def peak_gb(fn, model, optimizer) -> float | None:
    """The memory of a model trained by `optimizer` while fn runs, in GB: its resident weights and optimiser
    state plus the peak that fn allocates above what is allocated now (the other model, the data and caches left
    out). None off CUDA, where the same steps run and the same resident bytes are counted."""
    device = next(model.parameters()).device
    resident = resident_bytes(model, optimizer)
    if device.type != "cuda":
        fn()
        return None
    sync(device)
    base = torch.cuda.memory_allocated(device) - resident
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 1e9


def sdpa_sweep(cfg, batch_size: int, device: torch.device, dtype) -> dict:
    """fwd + bwd ms of each SDPA kernel at the model's attention shape (causal, 1/sqrt(d_k))."""
    H, T, d_k, d_v = cfg.model.n_head, cfg.data.seq_len, cfg.model.d_k, cfg.model.d_v
    gen = torch.Generator(device=device).manual_seed(0)
    q, k = (torch.randn(batch_size, H, T, d_k, device=device, dtype=dtype, generator=gen) for _ in range(2))
    v = torch.randn(batch_size, H, T, d_v, device=device, dtype=dtype, generator=gen)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = {}
    for backend in ("auto", *SDPA_BACKENDS):
        def run():
            fused_attention(q, k, v, scale=d_k ** -0.5, causal=True, backend=backend).sum().backward()  # noqa: B023
        try:
            for _ in range(2):
                run()
            sync(device)
            t0 = time.perf_counter()
            for _ in range(10):
                run()
            sync(device)
            out[backend] = {"ms": 1e3 * (time.perf_counter() - t0) / 10}
        except RuntimeError as err:
            out[backend] = {"error": str(err).strip().splitlines()[0][:200]}
    return out


def kernel_profile(run, steps: int, device: torch.device, top: int = 30, work=None) -> dict:
    """Time per step of each kernel (CUDA; on the CPU each op's own time) over `steps` steps, largest first.
    work: what one "step" is (default: a training step without a probe), e.g. one probe."""
    work = work or (lambda: run.step(with_probe=False))
    cuda = device.type == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    sync(device)
    with torch.profiler.profile(activities=[activity]) as prof:
        for _ in range(steps):
            work()
        sync(device)
    rows = []
    for e in prof.key_averages():  # self time: a kernel's time counted once, not again in the op that launched it
        us = e.self_device_time_total if cuda else e.self_cpu_time_total
        if us > 0:
            rows.append((e.key, us / 1e3 / steps, e.count // steps))
    rows.sort(key=lambda r: -r[1])
    return {"ms_per_step": sum(r[1] for r in rows),
            "kernels": [{"name": name[:120], "ms_per_step": ms, "calls_per_step": calls}
                        for name, ms, calls in rows[:top]]}


def tokens_per_s(tokens: int, seconds: float) -> float:
    return tokens / max(seconds, 1e-12)


class Result:
    """The JSON result, written again after every stage so a run cut short still leaves what it measured."""

    def __init__(self, path: Path, head: dict):
        self.path, self.data = path, head

    def update(self, **items) -> None:
        self.data.update(items)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")


def release(*runs) -> None:
    for run in runs:
        del run
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv=None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    cfg = compose_cfg(andrea_overrides(args) + args.override)
    window = args.window or (cfg.probe.every if cfg.probe.every > 0 else 100)
    device_name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name()
    argv_used = sys.argv[1:] if argv is None else list(argv)
    result = Result(args.out, {
        "command": "PYTHONPATH=. python3 benchmarks/throughput.py " + shlex.join(argv_used),
        "commit": git_commit(), "gpu": device_name, "torch": torch.__version__, "smoke": args.smoke,
        "batch_size": args.batch_size, "seq_len": args.seq_len, "vocab_size": args.vocab,
        "compile_mode": args.compile_mode, "andrea_overrides": andrea_overrides(args) + args.override,
        "probe_every": cfg.probe.every, "probe_batch_size": cfg.probe.batch_size, "window_steps": window,
        "target_ratio": TARGET_RATIO, "goal_ratio": GOAL_RATIO, "attn_stats": cfg.train.attn_stats,
        "reference": "nanoGPT" if args.nanogpt else "benchmarks/reference_gpt.py",
        "nanogpt_model_py": None if args.nanogpt is None else {
            "path": str(args.nanogpt), "sha256": hashlib.sha256(args.nanogpt.read_bytes()).hexdigest()}})
    tokens_per_window = args.batch_size * args.seq_len * window

    def say(text: str) -> None:
        print(f"[throughput {time.perf_counter() - started:6.1f}s] {text}", flush=True)

    tmp = tempfile.TemporaryDirectory()
    andrea = CellRun(cfg, Path(tmp.name))
    device = andrea.cell.rt.device
    reference = ReferenceRun(cfg, andrea.cell.data, device, andrea.cell.rt.autocast, args.compile_mode,
                             cfg.train.compile, nanogpt=load_nanogpt(args.nanogpt) if args.nanogpt else None)
    say(f"ANDREA {andrea.cell.model.num_params():,} parameters, reference {reference.params:,}; "
        f"{device_name}, torch {torch.__version__}")
    result.update(params=andrea.cell.model.num_params(), reference_params=reference.params,
                  model_config={k: v for k, v in vars(andrea.cell.model.cfg).items()})

    if not args.no_sdpa_sweep:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        sweep = sdpa_sweep(cfg, args.batch_size, device, dtype)
        say("SDPA fwd+bwd at the model's shape: " + ", ".join(
            f"{k} {v['ms']:.2f} ms" if "ms" in v else f"{k} n/a" for k, v in sweep.items()))
        result.update(sdpa_backends_ms=sweep)

    # peaks: the first COMPILE_STEPS steps compile (a one-off transient, reported apart); the steps after them
    # include the graph's capture, whose allocations are the replayed step's memory
    t0 = time.perf_counter()
    reference_compile_peak = peak_gb(lambda: [reference.step() for _ in range(COMPILE_STEPS)], reference.model,
                                     reference.optimizer)
    reference_peak = peak_gb(lambda: [reference.step() for _ in range(args.warmup_steps)], reference.model,
                             reference.optimizer)
    compile_ref_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    andrea_compile_peak = peak_gb(lambda: [andrea.step(with_probe=False) for _ in range(COMPILE_STEPS)],
                                  andrea.cell.model, andrea.cell.optimizer)
    andrea_train_peak = peak_gb(lambda: [andrea.step(with_probe=False) for _ in range(args.warmup_steps)],
                                andrea.cell.model, andrea.cell.optimizer)
    if andrea.probe is not None:
        andrea.probe.measure(andrea.step_no)  # the probe's first call (eager kernels, handles) is warm-up too
    andrea_probe_peak = None
    if andrea.probe is not None:
        andrea_probe_peak = peak_gb(lambda: andrea.probe.measure(andrea.step_no), andrea.cell.model,
                                    andrea.cell.optimizer)
    compile_andrea_s = time.perf_counter() - t0
    if andrea.probe is not None:  # what one probe costs: a window of probe.every steps pays it once
        result.update(probe_ms=1e3 * timed(lambda: andrea.probe.measure(andrea.step_no), 3, lambda: sync(device)))
        say(f"one probe: {result.data['probe_ms']:.1f} ms")
    peaks = [p for p in (andrea_train_peak, andrea_probe_peak) if p is not None]
    result.update(warmup_s={"reference": compile_ref_s, "andrea": compile_andrea_s},
                  andrea_step_graphed=andrea.cell.graphed,
                  reference_peak_mem_gb=reference_peak, peak_mem_gb=max(peaks) if peaks else None,
                  andrea_train_step_peak_mem_gb=andrea_train_peak, andrea_probe_peak_mem_gb=andrea_probe_peak,
                  compile_peak_mem_gb={"reference": reference_compile_peak, "andrea": andrea_compile_peak},
                  memory_note="a model's parameters and Adam state plus the peak its steps allocate above "
                              "that (the other model, the data and caches left out), over the steps after the "
                              f"first {COMPILE_STEPS} (compilation; its transient is compile_peak_mem_gb); with a "
                              "CUDA graph those steps include the capture. ANDREA's peak is the larger of its "
                              "training steps and a probe")
    say(f"warm-up: reference {compile_ref_s:.1f}s, ANDREA {compile_andrea_s:.1f}s; peak memory: reference "
        f"{reference_peak or 0:.2f} GB, ANDREA train step {andrea_train_peak or 0:.2f} GB, probe "
        f"{andrea_probe_peak or 0:.2f} GB")

    if args.profile > 0:
        profiles = {name: kernel_profile(run, args.profile, device) for name, run in
                    (("reference", reference), ("andrea", andrea))}
        if andrea.probe is not None:
            profiles["andrea_probe"] = kernel_profile(andrea, 1, device,
                                                      work=lambda: andrea.probe.measure(andrea.step_no))
        for name, prof in profiles.items():
            say(f"{name}: {prof['ms_per_step']:.2f} kernel ms a step; top kernels (ms, calls a step):")
            for k in prof["kernels"][:20]:
                print(f"    {k['ms_per_step']:7.3f} {k['calls_per_step']:4d}  {k['name']}", flush=True)
        result.update(profile=profiles)

    # align ANDREA's step count so each window of probe.every steps starts with a probe
    if andrea.probe is not None and window % cfg.probe.every == 0:
        while andrea.step_no % cfg.probe.every:
            andrea.step(with_probe=False)
    pairs = []
    for i in range(args.pairs):
        probes_before = andrea.probes_run
        t_ref = timed_window(reference, window, device)
        t_andrea = timed_window(andrea, window, device)
        pair = {"reference_tokens_per_s": tokens_per_s(tokens_per_window, t_ref),
                "tokens_per_s": tokens_per_s(tokens_per_window, t_andrea),
                "ratio": t_ref / t_andrea, "probes_in_window": andrea.probes_run - probes_before}
        pairs.append(pair)
        say(f"pair {i}: reference {pair['reference_tokens_per_s']:,.0f} tok/s, ANDREA {pair['tokens_per_s']:,.0f} "
            f"tok/s ({pair['probes_in_window']} probe), ratio {pair['ratio']:.3f}")
        result.update(pairs=pairs)
    andrea.flush()
    headline_losses = list(andrea.losses)
    ratio = statistics.median(p["ratio"] for p in pairs)
    total_ref = sum(tokens_per_window / p["reference_tokens_per_s"] for p in pairs)
    total_andrea = sum(tokens_per_window / p["tokens_per_s"] for p in pairs)
    result.update(tokens_per_s=tokens_per_window * len(pairs) / total_andrea,
                  reference_tokens_per_s=tokens_per_window * len(pairs) / total_ref,
                  ratio=ratio, ratio_aggregate=total_ref / total_andrea,
                  ratio_target_met=ratio >= TARGET_RATIO,
                  memory_target_met=None if reference_peak is None else max(peaks) <= reference_peak,
                  andrea_last_loss=andrea.losses[-1] if andrea.losses else None)
    if args.nanogpt is not None:  # the same figures under the names that say what the reference is
        result.update(nanogpt_tokens_per_s=result.data["reference_tokens_per_s"],
                      andrea_tokens_per_s=result.data["tokens_per_s"], ratio_vs_nanogpt=ratio)
    say(f"ANDREA {result.data['tokens_per_s']:,.0f} tok/s, reference {result.data['reference_tokens_per_s']:,.0f} "
        f"tok/s: median ratio {ratio:.3f} (target {TARGET_RATIO}, goal {GOAL_RATIO})")

    variants = {}
    headline_cost = compile_andrea_s + 2 * max(total_andrea, total_ref) / len(pairs)
    for spec in args.variant:
        if time.perf_counter() - started + headline_cost > args.budget_s:
            variants[spec] = {"skipped": f"would pass --budget-s {args.budget_s:g}"}
            say(f"variant {spec}: skipped (time budget)")
            continue
        try:
            release(andrea)
            andrea = None
            vcfg = compose_cfg(andrea_overrides(args) + args.override + spec.split(","))
            run = CellRun(vcfg, Path(tmp.name))
            for _ in range(COMPILE_STEPS):
                run.step(with_probe=False)
            vpeak = peak_gb(lambda: [run.step(with_probe=False) for _ in range(args.warmup_steps)],  # noqa: B023
                            run.cell.model, run.cell.optimizer)
            while run.probe is not None and run.step_no % vcfg.probe.every:
                run.step(with_probe=False)
            t_ref = timed_window(reference, window, device)
            t_run = timed_window(run, window, device)
            run.flush()
            common = min(len(run.losses), len(headline_losses))
            variants[spec] = {"tokens_per_s": tokens_per_s(tokens_per_window, t_run),
                              "reference_tokens_per_s": tokens_per_s(tokens_per_window, t_ref),
                              "ratio": t_ref / t_run, "train_step_peak_mem_gb": vpeak, "step_graphed": run.cell.graphed,
                              # the same batches from the same seed: a fast path must not change the losses
                              "loss_max_abs_diff_vs_headline": max(abs(a - b) for a, b in zip(
                                  run.losses[:common], headline_losses[:common])) if common else None,
                              "loss_steps_compared": common,
                              # later steps drift apart by chance at this LR (bf16, atomics): the first ones
                              # are where a wrong fast path would show
                              "loss_max_abs_diff_first_10_steps": max(abs(a - b) for a, b in zip(
                                  run.losses[:10], headline_losses[:10])) if common else None}
            say(f"variant {spec}: ratio {t_ref / t_run:.3f}, train-step peak {vpeak or 0:.2f} GB")
            release(run)
        except Exception as err:  # an ablation failing must not lose the headline
            variants[spec] = {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:200]}"}
            say(f"variant {spec}: failed: {variants[spec]['error']}")
        result.update(variants=variants)
    result.update(variants=variants, total_s=time.perf_counter() - started)
    tmp.cleanup()
    say(f"wrote {args.out}")
    print(json.dumps(result.data, indent=2), flush=True)
    return result.data


if __name__ == "__main__":
    main()
