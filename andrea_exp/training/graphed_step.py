"""One training step captured once as a CUDA graph and replayed: small cells at GPU speed.

A small cell (andrea_small at T 128) spends most of an eager step launching kernels and running Python;
a replayed graph launches the whole step (forward, backward, global gradient norm, clipping, AdamW) at
once. With train.compile the compiled model is captured: compilation happens in the eager warm-up steps,
and the graph replays inductor's kernels together with the clipping and the optimiser, which otherwise
leave the GPU waiting on the host between steps at ANDREA-120M's size. The recipe is PyTorch's whole-network capture:
- static input buffers x, y on the device; each replayed step copies its batch into them;
- the first WARMUP_STEPS steps of a run (and of a resumed run) run eagerly on a side stream: they are
  real steps, and they create the gradients and the optimiser's state before the capture;
- then the gradients are set to None and one step is captured; capture runs nothing, so that step is
  replayed at once; later steps replay. No zero_grad between replays: the graph's backward writes
  the gradients into the same buffers every time.

Learning rate: AdamW is fused with capturable=True, and during the capture each group's lr is a 0-dim
CUDA float32 tensor, which the graph reads at every replay. The schedule keeps computing in Python
floats on the groups, the same arithmetic as an eager run, and before each replay each tensor is
filled with its group's float (`lr_tensor.fill_`). torch's LRScheduler would fill a tensor lr itself,
but its chained formulas would then run on float32 tensors and drift from an eager run's values;
with floats on the groups, checkpoints of either mode resume in the other.
"""

from __future__ import annotations

import contextlib

import torch

from andrea_exp.config.validation import ConfigError
from andrea_exp.runs import timeline

WARMUP_STEPS = 3  # eager steps on a side stream before the capture (allocator and optimiser state)


def use_cuda_graph(setting, *, device_type: str, world_size: int, dropout: float, compile: bool = False) -> bool:
    """train.cuda_graph -> whether the step is captured. auto: on when nothing stands against it and the
    model is not compiled; true: required (one-line ConfigError naming what stands against it), and the
    compiled model is captured too; false: eager.

    auto leaves a compiled model eager because capturing it has been checked against the eager compiled
    step only by the H200 throughput run's training, not yet by tests/test_graphed_step.py on a GPU."""
    if setting is False:
        return False
    against = [why for why, bad in ((f"the device is {device_type}", device_type != "cuda"),
                                    (f"{world_size} processes", world_size != 1),
                                    (f"model.dropout is {dropout:g}", dropout != 0)) if bad]
    if against and setting is True:
        raise ConfigError("train.cuda_graph=true needs one CUDA process and model.dropout=0; "
                          f"here {', '.join(against)}")
    return not against and (setting is True or not compile)


def grad_norm(params) -> torch.Tensor:
    """Global L2 norm of all gradients, on the device (no sync)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads, norm_type=2.0)


def step_body(model, params, optimizer, x, y, autocast, grad_clip: float):
    """Forward, backward, global gradient norm (before clipping), clipping and the optimiser update;
    returns (loss, grad norm) on the device. The same code runs eagerly and under capture."""
    with autocast():
        _, loss = model(x, y)
    loss.backward()
    gn = grad_norm(params)
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, gn)
    optimizer.step()
    return loss.detach(), gn.detach()


class GraphedStep:
    """`step(x, y) -> (loss, grad norm, lr used)` like the eager train_step: loss and grad norm are
    fresh device tensors (clones of the graph's static outputs), lr a float. Steps the scheduler.

    fallback: when the capture fails, print one line and go on eagerly (train.cuda_graph=auto);
    otherwise the error propagates.
    """

    def __init__(self, model, params, optimizer, scheduler, *, amp_dtype: torch.dtype | None, grad_clip: float,
                 fallback: bool, warmup_steps: int = WARMUP_STEPS, log=print):
        self.model, self.params, self.optimizer, self.scheduler = model, params, optimizer, scheduler
        self.amp_dtype, self.grad_clip, self.fallback, self.log = amp_dtype, grad_clip, fallback, log
        self.eager_left = warmup_steps
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        device = params[0].device
        for group in optimizer.param_groups:  # after a checkpoint restore too: load_state_dict replaces them
            group["capturable"] = True
        self.lrs = [torch.tensor(float(g["lr"]), dtype=torch.float32, device=device) for g in optimizer.param_groups]
        self.side = torch.cuda.Stream(device)
        self.static: dict[str, torch.Tensor] = {}

    def autocast(self):
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda", dtype=self.amp_dtype, cache_enabled=False)  # no cache: capture

    def __call__(self, x: torch.Tensor, y: torch.Tensor):
        # the capture's static buffers are contiguous; batches are views of (B, T+1) rows. A compiled model
        # guards on strides, so warm-up steps given the views would compile for them and the capture would
        # recompile: compilation cannot run while a stream is capturing
        x, y = x.contiguous(), y.contiguous()
        lr = self.scheduler.get_last_lr()[0]
        if self.eager_left > 0:
            self.eager_left -= 1
            loss, gn = self._eager_on_side_stream(x, y)
        elif self.graph is None and not self.failed:
            with timeline.span("capture"):
                self._capture(x, y)
            loss, gn = self._replay(x, y) if self.graph is not None else self._eager(x, y)
        elif self.graph is not None:
            loss, gn = self._replay(x, y)
        else:
            loss, gn = self._eager(x, y)
        self.scheduler.step()
        return loss, gn, lr

    def _eager(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        return step_body(self.model, self.params, self.optimizer, x, y, self.autocast, self.grad_clip)

    def _eager_on_side_stream(self, x, y):
        current = torch.cuda.current_stream()
        self.side.wait_stream(current)
        with torch.cuda.stream(self.side):
            loss, gn = self._eager(x, y)
        current.wait_stream(self.side)
        for t in (loss, gn):  # used (and freed) on the current stream
            t.record_stream(current)
        return loss, gn

    def _capture(self, x, y) -> None:
        self.static = {"x": x.clone(), "y": y.clone()}  # outside the graph's pool
        self.optimizer.zero_grad(set_to_none=True)  # the graph's backward allocates the gradients
        groups = self.optimizer.param_groups
        floats = [g["lr"] for g in groups]
        graph = torch.cuda.CUDAGraph()
        try:
            for group, lr in zip(groups, self.lrs):
                group["lr"] = lr
            with torch.cuda.graph(graph):
                self.static["loss"], self.static["gn"] = step_body(
                    self.model, self.params, self.optimizer, self.static["x"], self.static["y"], self.autocast,
                    self.grad_clip)
        except Exception as err:
            if not self.fallback:
                raise
            self.failed = True
            self.static = {}
            self.optimizer.zero_grad(set_to_none=True)
            # whatever was compiled during the failed capture may hold tensors from the graph's memory pool,
            # which is freed with the graph: drop all compiled code so the eager steps compile afresh
            torch.compiler.reset()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            self.log(f"[andrea-exp] CUDA graph capture failed ({type(err).__name__}: {first}); training eagerly")
            return
        finally:
            for group, lr in zip(groups, floats):
                group["lr"] = lr
        self.graph = graph

    def _replay(self, x, y):
        self.static["x"].copy_(x)
        self.static["y"].copy_(y)
        for group, lr in zip(self.optimizer.param_groups, self.lrs):
            lr.fill_(group["lr"])
        self.graph.replay()
        return self.static["loss"].clone(), self.static["gn"].clone()
