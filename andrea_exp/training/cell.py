"""One run's training pieces, built in the one order they need: the runtime, the data on its device, the model
from the seed, the optimiser and its schedule, a resumed run's checkpoint loaded into them, the attention
statistics (train.attn_stats: they add buffers to the model, so before anything compiles or captures it), the
module the step calls (compiled and/or DDP-wrapped) and the step (a replayed CUDA graph where train.cuda_graph
allows one). `train()` and every benchmark build a run here, so a benchmark times the step a run takes."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import OmegaConf

from andrea_exp.config.schema import ModelSchema
from andrea_exp.data.sources import build_dataset
from andrea_exp.instruments import attn_stats
from andrea_exp.model.decoder import Andrea
from andrea_exp.training import checkpoint
from andrea_exp.training.graphed_step import GraphedStep, step_body, use_cuda_graph
from andrea_exp.training.runtime import Runtime, all_reduce_mean, setup_runtime


@dataclass
class Cell:
    rt: Runtime
    data: object  # andrea_exp.data.sources' dataset, on rt.device
    model: torch.nn.Module  # the plain Andrea: evaluation and probes read it
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    stats: attn_stats.StepStats | attn_stats.Off
    train_model: torch.nn.Module  # what the step calls: `model` compiled and/or DDP-wrapped
    params: list[torch.Tensor]  # the trained parameters
    step: Callable  # step(x, y) -> (loss, grad norm before clipping, lr used), tensors left on the device

    @property
    def graphed(self) -> bool:
        """Whether the step replays a captured CUDA graph (after its warm-up steps)."""
        return getattr(self.step, "graph", None) is not None


def build_cell(cfg, rt: Runtime | None = None, resumed: dict | None = None, ckpt_path: Path | None = None) -> Cell:
    """The pieces of the run `cfg` describes. rt: the runtime when the caller set it up already (else set up
    here); resumed: a checkpoint's state (training.checkpoint.load) restored into the model, optimiser and
    schedule before the step is built (a resumed run starts with the graph's eager warm-up steps again), its
    file `ckpt_path` named in a refusal. The random streams are the caller's to restore, after its own set-up."""
    rt = rt or setup_runtime(cfg)
    torch.manual_seed(cfg.seed)
    data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed).to(rt.device)
    model = build_model(cfg, data.vocab_size).to(rt.device)
    optimizer, scheduler = build_optimizer(model, cfg, rt.device)
    if resumed is not None:
        checkpoint.restore(resumed, model=model, optimizer=optimizer, scheduler=scheduler,
                           max_steps=cfg.train.max_steps, path=ckpt_path)
    stats = attn_stats.from_config(cfg.train, model)  # before compile and capture: it adds buffers to the model
    train_model = wrap_for_training(model, cfg, rt)
    params = [p for p in model.parameters() if p.requires_grad]
    step = build_step(cfg, rt, train_model, params, optimizer, scheduler, cfg.train.grad_clip)
    return Cell(rt, data, model, optimizer, scheduler, stats, train_model, params, step)


# ---------------------------------------------------------------- the pieces


def build_model(cfg, vocab_size: int) -> Andrea:
    """The model of `cfg.model`; model.vocab_size null takes the data's `vocab_size`. cfg: the settings (a Config),
    or a composed or plain config (a run's saved config.yaml, a test's), read into the same dataclass."""
    if isinstance(cfg.model, ModelSchema):
        model = copy.copy(cfg.model)  # the settings keep model.vocab_size as given
    elif OmegaConf.get_type(cfg.model) is ModelSchema:
        model = OmegaConf.to_object(cfg.model)
    else:
        model = ModelSchema(**OmegaConf.to_container(cfg.model, resolve=True))
    if model.vocab_size is None:
        model.vocab_size = vocab_size
    built = Andrea(model)
    # a training setting the model's loss applies (0 where a saved or test config predates it)
    built.z_loss = float(getattr(getattr(cfg, "train", None), "z_loss", 0.0) or 0.0)
    return built


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


def wrap_for_training(model, cfg, rt: Runtime):
    """The module the step calls: compiled and/or DDP-wrapped; `model` itself stays plain for eval and probes."""
    wrapped = torch.compile(model, mode=cfg.train.compile_mode) if cfg.train.compile else model
    if rt.world_size > 1:
        ids = [rt.device.index] if rt.device.type == "cuda" else None
        wrapped = torch.nn.parallel.DistributedDataParallel(wrapped, device_ids=ids)
    return wrapped


def train_step(model, params, optimizer, scheduler, x, y, rt: Runtime, grad_clip: float):
    """One optimiser update; returns (loss, grad norm before clipping, lr used), tensors left on the device."""
    lr = scheduler.get_last_lr()[0]
    loss, gn = step_body(model, params, optimizer, x, y, rt.autocast, grad_clip)
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return all_reduce_mean(loss, rt), gn, lr


def build_step(cfg, rt: Runtime, train_model, params, optimizer, scheduler, grad_clip: float):
    """`step(x, y) -> (loss, grad norm, lr)`: a replayed CUDA graph (train.cuda_graph) or the eager train_step.
    Built after any checkpoint restore: a resumed run starts with the graph's eager warm-up steps again."""
    cuda_graph = cfg.train.cuda_graph
    if use_cuda_graph(cuda_graph, device_type=rt.device.type, world_size=rt.world_size,
                      dropout=float(cfg.model.dropout), compile=bool(cfg.train.compile)):
        return GraphedStep(train_model, params, optimizer, scheduler, amp_dtype=rt.amp_dtype, grad_clip=grad_clip,
                           fallback=cuda_graph == "auto", log=lambda line: print(line, flush=True))
    return functools.partial(train_step, train_model, params, optimizer, scheduler, rt=rt, grad_clip=grad_clip)
