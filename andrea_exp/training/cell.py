"""One run's training pieces, built in the one order they need: the runtime, the data on its device, the model
from the seed, the optimiser and its schedule, a resumed run's checkpoint loaded into them, the attention
statistics (train.attn_stats: they add buffers to the model, so before anything compiles or captures it), the
module the step calls (compiled and/or DDP-wrapped) and the step (a replayed CUDA graph where train.cuda_graph
allows one). `train()` and every benchmark build a run here, so a benchmark times the step a run takes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from andrea_exp.data.sources import build_dataset
from andrea_exp.instruments import attn_stats
from andrea_exp.training import checkpoint
from andrea_exp.training.runtime import Runtime, setup_runtime


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
    # the pieces sit beside the loop, which imports this module
    from andrea_exp.training.loop import build_model, build_optimizer, build_step, wrap_for_training

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
