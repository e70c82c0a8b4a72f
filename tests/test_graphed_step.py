"""train.cuda_graph: the settings logic on CPU; on a GPU, graphed steps equal eager steps, resume across the switch."""

from __future__ import annotations

import copy
import os

import pytest
import torch
from conftest import compose_tiny

from andrea_exp.config.validation import ConfigError
from andrea_exp.training.cell import build_model, build_optimizer, build_step, wrap_for_training
from andrea_exp.training.graphed_step import GraphedStep, use_cuda_graph
from andrea_exp.training.runtime import setup_runtime

ON = dict(device_type="cuda", world_size=1, dropout=0.0)
STEP_RUN = ("model.d_model=64", "model.n_layer=2", "model.block_size=32", "data.seq_len=32", "data.train_sequences=256",
            "train.max_steps=40", "train.warmup_steps=5", "train.grad_clip=0.05")




# ---------------------------------------------------------------- settings (CPU)


def test_auto_is_on_only_when_nothing_stands_against_it():
    assert use_cuda_graph("auto", **ON)
    for changed in ({"device_type": "cpu"}, {"world_size": 2}, {"dropout": 0.1}):
        assert not use_cuda_graph("auto", **{**ON, **changed}), changed
    assert not use_cuda_graph(False, **ON)
    assert use_cuda_graph(True, **ON)


def test_a_compiled_model_is_captured_only_when_asked():
    assert not use_cuda_graph("auto", **ON, compile=True)
    assert use_cuda_graph(True, **ON, compile=True)


@pytest.mark.parametrize("changed, named", [({"device_type": "cpu"}, "the device is cpu"),
                                            ({"world_size": 4}, "4 processes"),
                                            ({"dropout": 0.1}, "model.dropout is 0.1")])
def test_true_when_impossible_is_one_line_naming_why(changed, named):
    with pytest.raises(ConfigError, match="^train.cuda_graph=true needs one CUDA process") as err:
        use_cuda_graph(True, **{**ON, **changed})
    assert named in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("bad", ["yes", 1, 0, "null"])
def test_bad_value_is_refused_in_one_line_by_the_settings(bad):
    """One check, at validation, with the values as they are typed (true, false)."""
    from andrea_exp.config.validation import validate

    with pytest.raises(ConfigError, match=r"^train.cuda_graph must be one of auto, true, false; got [^\n]*$"):
        validate(compose_tiny(*STEP_RUN, f"train.cuda_graph={bad}"))


def test_cpu_run_stays_eager_under_auto_and_refuses_true():
    cfg = compose_tiny(*STEP_RUN, "train.device=cpu")
    rt = setup_runtime(cfg)
    model = build_model(cfg, 32)
    optimizer, scheduler = build_optimizer(model, cfg, rt.device)
    params = list(model.parameters())
    assert not isinstance(build_step(cfg, rt, model, params, optimizer, scheduler, 1.0), GraphedStep)
    cfg.train.cuda_graph = True
    with pytest.raises(ConfigError, match="the device is cpu"):
        build_step(cfg, rt, model, params, optimizer, scheduler, 1.0)


def test_schema_refuses_a_bad_value_and_keeps_the_setting_operational():
    from andrea_exp.config.schema import is_scientific
    from andrea_exp.config.validation import validate

    assert not is_scientific("train.cuda_graph")
    assert compose_tiny(*STEP_RUN).train.cuda_graph == "auto"
    validate(compose_tiny(*STEP_RUN, "train.cuda_graph=false"))
    with pytest.raises(ConfigError, match=r"^train.cuda_graph must be one of auto, true, false; got 'sometimes'$"):
        validate(compose_tiny(*STEP_RUN, "train.cuda_graph=sometimes"))


# ---------------------------------------------------------------- graphed = eager (GPU)

# Tolerance: the graph replays the very kernels of the eager step, in the same order on the same
# buffers, so losses and gradient norms are expected bitwise equal; 1e-6 absolute is the bound asserted.
# Eager GPU training is itself not reproducible at that level (atomic adds, e.g. the embedding's backward
# over repeated tokens: two eager andrea_small runs differ by ~1e-5 at step 2), so the GPU tests run with
# deterministic algorithms; cuBLAS needs its workspace setting before it starts.
TOL = 1e-6
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture
def deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


class Run:
    """A model, optimiser and schedule from cfg's seed on the GPU; `steps(a, b)` runs steps a..b-1."""

    def __init__(self, cfg, graphed: bool):
        self.cfg, self.graphed = cfg, graphed
        self.rt = setup_runtime(cfg)
        torch.manual_seed(cfg.seed)
        from andrea_exp.data.sources import build_dataset

        self.data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed).to(self.rt.device)
        self.model = build_model(cfg, self.data.vocab_size).to(self.rt.device)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, self.rt.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.train_model = wrap_for_training(self.model, cfg, self.rt)  # compiled when train.compile is true
        self.step = None

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

    def state(self) -> dict:
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                              "scheduler": self.scheduler.state_dict()})

    def steps(self, start: int, stop: int) -> list[tuple[float, float, float]]:
        cfg = self.cfg
        cfg.train.cuda_graph = self.graphed
        if self.step is None:  # built after any restore, as train() does
            self.step = build_step(cfg, self.rt, self.train_model, self.params, self.optimizer, self.scheduler,
                                   cfg.train.grad_clip)
            assert isinstance(self.step, GraphedStep) == self.graphed
        out = []
        for i in range(start, stop):
            x, y = self.data.batch(i, cfg.train.batch_size, cfg.seed, 0, 1)
            loss, gn, lr = self.step(x, y)
            out.append((loss, gn, lr))
        return [(loss.item(), gn.item(), lr) for loss, gn, lr in out]


def assert_same(a, b) -> None:
    assert len(a) == len(b)
    for i, ((la, ga, ra), (lb, gb, rb)) in enumerate(zip(a, b)):
        assert ra == rb, f"lr differs at step {i}"
        assert abs(la - lb) <= TOL and abs(ga - gb) <= TOL, f"step {i}: loss {la} vs {lb}, grad norm {ga} vs {gb}"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_twenty_graphed_steps_equal_eager_steps(precision, deterministic):
    cfg = compose_tiny(*STEP_RUN, f"train.precision={precision}")
    eager, graphed = Run(cfg, False).steps(0, 20), Run(cfg, True).steps(0, 20)
    assert any(gn > cfg.train.grad_clip for _, gn, _ in eager)  # clipping was active
    assert eager[0][2] < eager[6][2]  # so was the warm-up of the learning rate
    assert_same(eager, graphed)


@pytest.mark.gpu
def test_graphed_compiled_steps_equal_eager_compiled_steps():
    """train.compile with the graph: the compiled model is captured after its eager warm-up compiled it.
    Compiled kernels are not bitwise reproducible between runs, so the bound is looser than TOL."""
    cfg = compose_tiny(*STEP_RUN, "train.compile=true", "train.precision=bf16", "train.cuda_graph=true")
    eager, graphed = Run(cfg, False).steps(0, 12), Run(cfg, True).steps(0, 12)
    assert isinstance(Run(cfg, True).train_model, torch._dynamo.eval_frame.OptimizedModule)
    for i, ((la, ga, ra), (lb, gb, rb)) in enumerate(zip(eager, graphed)):
        assert ra == rb and abs(la - lb) <= 1e-3 and abs(ga - gb) <= 1e-3 * max(ga, 1.0), (i, la, lb, ga, gb)


@pytest.mark.gpu
@pytest.mark.parametrize("first, second", [(False, True), (True, False), (True, True)])
def test_resume_across_the_switch_equals_an_unbroken_run(first, second, deterministic):
    cfg = compose_tiny(*STEP_RUN)
    unbroken = Run(cfg, False).steps(0, 20)
    before = Run(cfg, first)
    head = before.steps(0, 10)
    after = Run(cfg, second)
    after.restore(before.state())
    assert_same(unbroken, head + after.steps(10, 20))


@pytest.mark.gpu
def test_a_failed_capture_under_auto_falls_back_to_eager_in_one_line(monkeypatch, deterministic):
    cfg = compose_tiny(*STEP_RUN)
    eager = Run(cfg, False).steps(0, 8)
    run, lines = Run(cfg, True), []

    def broken_graph(*args, **kwargs):
        raise RuntimeError("capture refused\nsecond line")

    monkeypatch.setattr(torch.cuda, "graph", broken_graph)
    cfg.train.cuda_graph = "auto"
    run.step = build_step(cfg, run.rt, run.model, run.params, run.optimizer, run.scheduler,
                          cfg.train.grad_clip)
    run.step.log = lines.append
    run.graphed = "auto"
    assert_same(eager, run.steps(0, 8))
    assert run.step.graph is None and len(lines) == 1 and "capture refused" in lines[0] and "\n" not in lines[0]
