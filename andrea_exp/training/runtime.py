"""Where and how a run computes: the device, the autocast precision and, under torchrun, the process
group, set up once at the start of `train()` and read by the step, evaluation, the bar and the summary; a
module of its own so that the environment's questions (which CUDA device, bf16 or fp32, which backend,
averaging across processes) sit in one place that tests and benchmarks call without the loop."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from andrea_exp.config.validation import FP16_REFUSED, ConfigError


@dataclass
class Runtime:
    device: torch.device
    rank: int = 0
    world_size: int = 1
    is_main: bool = True
    autocast: object = field(default_factory=lambda: contextlib.nullcontext)
    amp_dtype: torch.dtype | None = None  # the autocast dtype; None: no autocast


def setup_runtime(cfg) -> Runtime:
    """Pick the device and precision; join a torchrun process group when one is set up."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    precision = cfg.train.precision
    if precision == "fp16":
        raise ConfigError(FP16_REFUSED)
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
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision == "bf16":
        autocast = lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    return Runtime(device, rank, world_size, rank == 0, autocast, torch.bfloat16 if precision == "bf16" else None)


def all_reduce_mean(t: torch.Tensor, rt: Runtime) -> torch.Tensor:
    """The mean of `t` over the processes (gloo has no AVG, so SUM / world size there); `t` itself alone."""
    if rt.world_size > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG if t.device.type == "cuda" else dist.ReduceOp.SUM)
        if t.device.type != "cuda":
            t /= rt.world_size
    return t
