"""The training loop: optimiser, schedule, probes, evaluation, checkpoints, divergence."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from tqdm import tqdm

from andrea_exp import checkpoint
from andrea_exp.data import build_dataset
from andrea_exp.evaluate import evaluate, generate
from andrea_exp.model import Andrea, ModelConfig
from andrea_exp.tracking import Tracker

MODEL_FIELDS = set(ModelConfig.__dataclass_fields__)


class Diverged(Exception):
    """Training left the finite or the plausible: a result, not a crash."""


@dataclass
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    is_main: bool = True
    autocast: object = field(default_factory=lambda: contextlib.nullcontext)


def setup_runtime(cfg) -> Runtime:
    """Pick the device and precision; join a torchrun process group when one is set up."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    wanted = str(cfg.train.device)
    if wanted == "auto":
        wanted = "cuda" if torch.cuda.is_available() else "cpu"
    if wanted.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"train.device={cfg.train.device} but no CUDA device is visible")
    if world_size > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        backend = "nccl" if wanted.startswith("cuda") else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
        if wanted.startswith("cuda"):
            wanted = f"cuda:{local_rank}"
    device = torch.device(wanted)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    precision = cfg.train.precision
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is None:
        autocast = contextlib.nullcontext
    else:
        autocast = lambda: torch.autocast(device_type=device.type, dtype=dtype)  # noqa: E731
    return Runtime(device, rank, world_size, rank == 0, autocast)


def build_model(cfg, vocab_size: int) -> Andrea:
    fields = {k: v for k, v in OmegaConf.to_container(cfg.model, resolve=True).items() if k in MODEL_FIELDS}
    fields["vocab_size"] = cfg.model.get("vocab_size") or vocab_size
    return Andrea(ModelConfig(**fields))


def build_optimizer(model, cfg, device):
    tc = cfg.train
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.param_groups(tc.weight_decay), lr=tc.lr, betas=(tc.beta1, tc.beta2),
                                  fused=fused)
    warmup = max(tc.warmup_steps, 0)
    decay = max(tc.max_steps - warmup, 1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=decay, eta_min=tc.lr * tc.min_lr_ratio)
    if warmup == 0:
        return optimizer, cosine
    ramp = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1.0 / (warmup + 1), total_iters=warmup)
    return optimizer, torch.optim.lr_scheduler.SequentialLR(optimizer, [ramp, cosine], milestones=[warmup])


def grad_norm(params) -> torch.Tensor:
    """Global L2 norm of all gradients, on the device (no sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0)


class DivergenceWatch:
    """Non-finite loss or gradient, or a loss above factor x the initial loss `patience` times in a row."""

    def __init__(self, factor: float, patience: int):
        self.factor, self.patience = factor, patience
        self.initial: float | None = None
        self.streak = 0

    def state(self) -> dict:
        return {"initial_loss": self.initial, "diverge_streak": self.streak}

    def load_state(self, state: dict) -> None:
        self.initial, self.streak = state.get("initial_loss"), state.get("diverge_streak", 0)

    def check(self, step: int, loss: float, gnorm: float) -> None:
        if not (math.isfinite(loss) and math.isfinite(gnorm)):
            raise Diverged(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient norm'} at step {step}")
        if self.initial is None:
            self.initial = loss
        self.streak = self.streak + 1 if loss > self.factor * self.initial else 0
        if self.streak >= self.patience:
            raise Diverged(f"loss {loss:.3g} above {self.factor:g} x initial {self.initial:.3g} for "
                           f"{self.patience} steps at step {step}")


def _plain(metrics: dict) -> dict:
    """Numbers and strings only, so a checkpoint stays loadable with weights_only=True."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
    return out


def _all_reduce_mean(t: torch.Tensor, rt: Runtime) -> torch.Tensor:
    if rt.world_size > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.device.type == "cuda" else dist.ReduceOp.SUM)
        if t.device.type != "cuda":
            t /= rt.world_size
    return t


def show_progress(cfg, rt: Runtime) -> bool:
    setting = cfg.train.progress
    if setting == "auto":
        return rt.is_main and sys.stderr.isatty()
    return bool(setting) and rt.is_main


def train(cfg, run_dir: Path) -> dict:
    """Train one run described by cfg into run_dir; return its summary. Raises only on real errors."""
    rt = setup_runtime(cfg)
    tc = cfg.train
    torch.manual_seed(cfg.seed)
    data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed).to(rt.device)
    model = build_model(cfg, data.vocab_size).to(rt.device)
    if rt.is_main:
        print(f"[andrea-exp] model {cfg.model.name}: {model.num_params() / 1e6:.2f}M parameters "
              f"(d_model {cfg.model.d_model}, {cfg.model.n_layer} layers, {cfg.model.n_head} heads, "
              f"d_k {cfg.model.d_k}, d_v {cfg.model.d_v}, vocab {model.cfg.vocab_size}) on {rt.device}", flush=True)
    optimizer, scheduler = build_optimizer(model, cfg, rt.device)
    if tc.batch_size % rt.world_size:
        raise ValueError(f"train.batch_size ({tc.batch_size}) must be divisible by the number of processes "
                         f"({rt.world_size})")
    local_bs = tc.batch_size // rt.world_size

    ckpt_dir = run_dir / "checkpoints"
    start_step = 0
    state = checkpoint.load(ckpt_dir) if tc.resume else None
    if state is not None:
        checkpoint.restore(state, model=model, optimizer=optimizer, scheduler=scheduler, max_steps=tc.max_steps,
                           path=ckpt_dir / checkpoint.LATEST)
        start_step = state["step"]
        if rt.is_main:
            print(f"[andrea-exp] resuming {run_dir} from step {start_step}", flush=True)
    elif tc.resume and rt.is_main:
        print(f"[andrea-exp] train.resume=true but {ckpt_dir} holds no checkpoint; starting from step 0 "
              "(resume needs the run's own hydra.run.dir)", flush=True)
    resume_step = start_step if state is not None else None
    tracker = Tracker(run_dir, cfg, enabled=rt.is_main, resume_step=resume_step)

    train_model = torch.compile(model) if tc.compile else model
    if rt.world_size > 1:
        ids = [rt.device.index] if rt.device.type == "cuda" else None
        train_model = torch.nn.parallel.DistributedDataParallel(train_model, device_ids=ids)

    held_out = data.eval.tokens
    probe = None
    if cfg.probe.every > 0 and rt.is_main:
        from andrea_exp.probe import Probe

        probe = Probe(model, held_out[: cfg.probe.batch_size], cfg.probe, run_dir)

    params = [p for p in model.parameters() if p.requires_grad]
    watch = DivergenceWatch(tc.diverge_factor, tc.diverge_patience)
    if state is not None:
        watch.load_state(state["extra"])
    tokens_per_step = tc.batch_size * cfg.data.seq_len
    best_eval = state["extra"].get("best_eval", math.inf) if state is not None else math.inf
    last: dict = dict(state["extra"].get("last", {})) if state is not None else {}
    at_step: dict = {"step": None, "records": []}  # records logged at the latest step, for the checkpoint
    window: list[tuple[int, torch.Tensor, torch.Tensor, float]] = []
    window_start, excluded = time.perf_counter(), 0.0
    step = start_step
    bar = tqdm(total=tc.max_steps, initial=start_step, disable=not show_progress(cfg, rt), desc="train",
               dynamic_ncols=True)
    # settings the step loop reads, as plain values: each OmegaConf lookup costs microseconds of host time
    max_steps, log_every, grad_clip = tc.max_steps, tc.log_every, tc.grad_clip
    eval_every, ckpt_every = tc.eval_every, tc.ckpt_every
    probe_every, maps_every, seed = cfg.probe.every, cfg.probe.maps_every, cfg.seed

    def log(metrics: dict, at: int) -> None:
        last.update(metrics)
        tracker.log(metrics, at)
        if at_step["step"] != at:
            at_step["step"], at_step["records"] = at, []
        at_step["records"].append(metrics)

    def flush_window() -> None:
        """One host sync per window: log each recorded step and check for divergence."""
        nonlocal window, window_start, excluded
        if not window:
            return
        values = torch.stack([torch.stack([loss, gn]) for _, loss, gn, _ in window]).float().tolist()  # the sync
        elapsed = time.perf_counter() - window_start - excluded
        rate = tokens_per_step * len(window) / max(elapsed, 1e-9)
        clip_hits = 0
        for (at, _, _, lr), (loss, gn) in zip(window, values):
            clipped = grad_clip > 0 and gn > grad_clip
            clip_hits += clipped
            row = {"train/loss": loss, "grad/norm": gn, "train/lr": lr, "train/tokens": (at + 1) * tokens_per_step}
            if at == window[-1][0]:
                row.update({"train/tokens_per_s": rate, "train/grad_clip_frac": clip_hits / len(window)})
            log(row, at)
        for (at, *_), (loss, gn) in zip(window, values):
            watch.check(at, loss, gn)  # after logging the window: a diverged run keeps every record it made
        bar.set_postfix(loss=f"{values[-1][0]:.3f}")
        window, window_start, excluded = [], time.perf_counter(), 0.0

    def timed_aside(fn):
        """Run work that is not training (eval, checkpoint) and keep it out of tokens/s."""
        nonlocal excluded
        t0 = time.perf_counter()
        out = fn()
        excluded += time.perf_counter() - t0
        return out

    def run_eval(at: int) -> None:
        nonlocal best_eval
        if not rt.is_main:
            return
        with rt.autocast():
            metrics = evaluate(model, held_out, data.floor)
        best_eval = min(best_eval, metrics["eval/loss_as_trained"])
        log(metrics, at)

    def save_checkpoint(at: int) -> None:
        if rt.is_main:
            # records already logged at this step (the evaluation before the save): metrics.jsonl is cut at
            # `at` on resume, and the resumed loop does not log them again
            logged_here = at_step["records"] if at_step["step"] == at else []
            extra = {**watch.state(), "best_eval": best_eval, "max_steps": tc.max_steps,
                     "last": _plain(last), "records_at_step": [_plain(r) for r in logged_here]}
            checkpoint.save(ckpt_dir, step=at, model=model, optimizer=optimizer, scheduler=scheduler, extra=extra)

    if state is not None and start_step < tc.max_steps:
        for record in state["extra"].get("records_at_step", []):
            log(record, start_step)
    if state is not None:
        checkpoint.set_rng_state(state["rng"])  # last, after every set-up step that might draw numbers

    def loop() -> dict:
        nonlocal step
        status, error = "finished", None
        started = time.perf_counter()
        try:
            while step < max_steps:
                if probe is not None and step % probe_every == 0:
                    log(probe.measure(step), step)
                if probe is not None and maps_every and step % maps_every == 0:
                    # drawing the PNGs and handing them to W&B is not training: kept out of tokens/s
                    timed_aside(lambda: tracker.log_images(probe.draw_maps(step), step))
                x, y = data.batch(step, local_bs, seed, rt.rank, rt.world_size)
                with rt.autocast():
                    _, loss = train_model(x, y)
                loss.backward()
                gn = grad_norm(params)  # global, before clipping
                if grad_clip > 0:
                    torch.nn.utils.clip_grads_with_norm_(params, grad_clip, gn)
                lr = scheduler.get_last_lr()[0]
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                window.append((step, _all_reduce_mean(loss.detach(), rt), gn.detach(), lr))
                step += 1
                bar.update(1)
                eval_due = eval_every and step % eval_every == 0 and step < max_steps
                ckpt_due = ckpt_every and step % ckpt_every == 0 and step < max_steps
                # a checkpoint at step S must follow every record of steps < S and the divergence checks
                if len(window) >= log_every or step == max_steps or eval_due or ckpt_due:
                    flush_window()
                if eval_due:
                    timed_aside(lambda: run_eval(step))
                if ckpt_due:
                    timed_aside(lambda: save_checkpoint(step))
        except Diverged as why:
            status, error = "diverged", str(why)
            if rt.is_main:
                print(f"[andrea-exp] diverged: {why}", flush=True)
        finally:
            bar.close()

        summary = {"run/status": status, "run/steps": step, "run/wall_s": time.perf_counter() - started,
                   "train/world_size": rt.world_size, "model/params": model.num_params(),
                   "system/gpu": torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu",
                   "system/torch": torch.__version__,
                   "data/log_vocab": math.log(data.vocab_size)}
        if error:
            summary["run/error"] = error
        if status == "finished" and rt.is_main:
            if probe is not None:
                log(probe.measure(step), step)
            run_eval(step)
            save_checkpoint(step)
            prompt = held_out[:1, : min(8, held_out.size(1))]
            with rt.autocast():
                sample = generate(model.eval(), prompt, tc.sample_tokens, seed=cfg.seed)[0].tolist()
            summary["eval/sample"] = " ".join(map(str, sample))
        summary.update(last)
        summary["best/eval/loss_as_trained"] = best_eval if math.isfinite(best_eval) else None
        return summary

    try:
        summary = loop()
    except Exception as err:
        tracker.finish({"run/status": "failed", "run/error": f"{type(err).__name__}: {err}", "run/steps": step,
                        "train/world_size": rt.world_size, **last}, failed=True)
        raise
    tracker.finish(summary)
    return summary
