"""Every benchmark in benchmarks/ (and every study in benchmarks/investigations/ that the READMEs cite) runs here
through its whole main path at small shapes for a few steps: on the GPU (marked `gpu`: the compiled and graphed
steps, peak memory, the profiles, the kernels) and, where the same path runs on the CPU, on the CPU too. Each
test calls the script's main() in this process (or runs the command it times), so a benchmark whose main path
raises fails its test; what a script records instead of raising (an ablation's or a kernel's error) is asserted
absent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from conftest import compose_tiny

from andrea_exp.runs import metric_keys as K

# ---------------------------------------------------------------- the step the benchmarks take


def test_benchmark_step_reproduces_train_losses(tmp_path: Path):
    """A benchmark's cell, stepped by benchmarks.common.CellRun, takes train()'s steps: the same losses as train()
    for the same settings, and a probe at train()'s cadence."""
    from andrea_exp.training.loop import train
    from benchmarks.common import CellRun, compose_cfg

    overrides = ["model=andrea_tiny", "train.device=cpu", "train.max_steps=6", "train.log_every=2",
                 "train.eval_every=0", "train.sample_tokens=0", "probe.every=3", "probe.maps_every=0",
                 "logger.mode=disabled", "train.progress=false", "data.train_sequences=64", "data.eval_sequences=8"]
    (tmp_path / "train").mkdir()
    train(compose_cfg(overrides), tmp_path / "train")
    logged = [json.loads(line) for line in (tmp_path / "train" / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r[K.TRAIN_LOSS] for r in logged if K.TRAIN_LOSS in r}
    run = CellRun(compose_cfg(overrides), tmp_path / "bench")
    for _ in range(6):
        run.step()
    run.flush()
    assert run.probes_run == 2
    assert run.losses == [by_step[s] for s in range(6)]  # the same step on the same batches: bitwise


# ---------------------------------------------------------------- throughput.py (with reference_gpt.py)


def test_reference_gpt_has_andrea_120m_parameter_count():
    from benchmarks.reference_gpt import GPT, GPTConfig

    with torch.device("meta"):
        assert GPT(GPTConfig()).num_params() == 124_439_040  # ANDREA-120M's count (tests/test_model.py)


def run_throughput(tmp_path: Path, *extra: str) -> dict:
    from benchmarks.throughput import main

    out = tmp_path / "t.json"
    data = main(["--smoke", "--pairs", "2", "--profile", "1", "--variant", "model.fused_qkv=false", *extra,
                 "--out", str(out)])
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(data))
    assert written["ratio"] > 0
    assert len(written["pairs"]) == 2 and all(p["probes_in_window"] == 1 for p in written["pairs"])
    for key in ("tokens_per_s", "reference_tokens_per_s", "peak_mem_gb", "reference_peak_mem_gb", "commit",
                "gpu", "torch", "command", "sdpa_backends_ms", "probe_ms"):
        assert key in written, key
    assert written["params"] == written["reference_params"]  # same shapes, same parameter count
    assert set(written["profile"]) == {"reference", "andrea", "andrea_probe"}
    assert all(p["ms_per_step"] > 0 for p in written["profile"].values())
    variant = written["variants"]["model.fused_qkv=false"]
    assert "error" not in variant and variant["ratio"] > 0
    return written


def test_throughput_runs_on_the_cpu(tmp_path: Path):
    written = run_throughput(tmp_path)
    assert written["gpu"] == "cpu" and written["peak_mem_gb"] is None  # peaks are CUDA's
    assert written["variants"]["model.fused_qkv=false"]["loss_max_abs_diff_first_10_steps"] < 1e-5


# nanoGPT's model.py interface (GPTConfig's fields, forward -> (logits, loss), configure_optimizers), as a file a
# user clones: here over benchmarks/reference_gpt.py, so the suite needs no network
NANOGPT_SHAPED = """
from dataclasses import dataclass
import torch
import torch.nn.functional as F
from benchmarks import reference_gpt

@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

class GPT(reference_gpt.GPT):
    def __init__(self, config):
        assert config.dropout == 0.0 and config.bias is False  # GPT-2-124M as nanoGPT's train.py builds it
        super().__init__(reference_gpt.GPTConfig(vocab_size=config.vocab_size, block_size=config.block_size,
                                                 n_layer=config.n_layer, n_head=config.n_head, d_model=config.n_embd))

    def forward(self, idx, targets=None):
        targets.view(-1)  # nanoGPT's loss views its targets: a batch must come contiguous
        return None, super().forward(idx, targets)

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        return self.optimizer(learning_rate, weight_decay, betas, fused=device_type == "cuda")
"""


def run_throughput_against_nanogpt(tmp_path: Path, *extra: str) -> dict:
    tmp_path.mkdir(exist_ok=True)
    model_py = tmp_path / "model.py"
    model_py.write_text(NANOGPT_SHAPED)
    written = run_throughput(tmp_path, "--nanogpt", str(model_py), "--override", "train.attn_stats=every", *extra)
    assert written["reference"] == "nanoGPT" and written["attn_stats"] == "every"
    assert written["nanogpt_model_py"]["sha256"] == hashlib.sha256(model_py.read_bytes()).hexdigest()
    assert written["nanogpt_tokens_per_s"] == written["reference_tokens_per_s"] > 0
    assert written["andrea_tokens_per_s"] == written["tokens_per_s"] > 0
    assert written["ratio_vs_nanogpt"] == written["ratio"]
    return written


def test_throughput_against_nanogpt_runs_on_the_cpu(tmp_path: Path):
    run_throughput_against_nanogpt(tmp_path)


def test_throughput_refuses_a_missing_nanogpt_file(tmp_path: Path, capsys):
    from benchmarks.throughput import main

    with pytest.raises(SystemExit):
        main(["--smoke", "--nanogpt", str(tmp_path / "nowhere.py")])
    assert "--nanogpt: no file" in capsys.readouterr().err


@pytest.mark.gpu
def test_throughput_runs_on_the_gpu(tmp_path: Path):
    written = run_throughput(tmp_path, "--device", "cuda")
    against = run_throughput_against_nanogpt(tmp_path / "nanogpt", "--device", "cuda")
    assert against["gpu"] != "cpu" and against["peak_mem_gb"] > 0
    assert written["andrea_step_graphed"] is True and written["variants"]["model.fused_qkv=false"]["step_graphed"]
    for key in ("peak_mem_gb", "reference_peak_mem_gb", "andrea_train_step_peak_mem_gb", "andrea_probe_peak_mem_gb"):
        assert written[key] > 0, key
    assert all("ms" in v for k, v in written["sdpa_backends_ms"].items() if k == "auto")


# ---------------------------------------------------------------- attn_stats_cost.py


def run_attn_stats_cost(tmp_path: Path, *extra: str) -> dict:
    from benchmarks.attn_stats_cost import main

    out = tmp_path / "attn_stats.json"
    data = main(["--smoke", "--arms", "off,every", "--cell-pairs", "1", *extra, "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(data))
    assert set(data["cost"]) == {"every"} and len(data["pairs"]) == 2
    # the arms start alike (throwaway models first, one per graph) and a second off arm is the yardstick
    assert data["throwaway_models"] == ["off", "every"]
    assert set(data["losses_vs_off"]) == {"every", "control"} and set(data["losses"]) == {"off", "every", "control"}
    steps = len(data["losses"]["off"])
    assert steps >= 10 and all(len(losses) == steps for losses in data["losses"].values())
    assert data["last_logged_stats"]["every"][K.ATTN_STEP_SCORE_MAX] > 0
    assert set(data["profile"]) == {"off", "every"}
    assert set(data["claims_grid_cells"]) == {"64", "4096"}
    assert data["claims_grid_cells"]["4096"]["attn_impl"] == "bilinear"
    return data


def test_attn_stats_cost_runs_on_the_cpu(tmp_path: Path):
    data = run_attn_stats_cost(tmp_path)
    for name in ("every", "control"):  # the statistics never change training: bitwise, at every step
        assert data["losses_vs_off"][name]["first_differing_step"] is None
        assert data["losses_vs_off"][name]["max_abs_diff"] == 0.0
    assert data["losses"]["every"] == data["losses"]["off"]
    assert "kernel_alone" not in data  # CUDA's


@pytest.mark.gpu
def test_attn_stats_cost_runs_on_the_gpu(tmp_path: Path):
    data = run_attn_stats_cost(tmp_path, "--device", "cuda")
    assert all(data["graphed"].values())
    alone = data["kernel_alone"]
    assert all(ms > 0 for ms in alone["ms"].values())
    assert all(err < 0.05 for errs in alone["max_rel_err_vs_explicit_float64"].values() for err in errs.values())
    assert data["profile"]["every"]["stats_kernels_ms_per_step"] > 0


# ---------------------------------------------------------------- claims_grid_speed.py


def test_claims_grid_speed_runs_on_the_cpu(tmp_path: Path):
    from benchmarks.claims_grid_speed import main, step_flops

    out = tmp_path / "speed.json"
    data = main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text()) == data and set(data["cells"]) == {"64", "4096"}
    cell = data["cells"]["64"]
    assert cell["eager_ms"] > 0 and cell["bound_ms"] > 0 and "graphed_ms" not in cell  # no graph on CPU
    # hand count: 6 * params * tokens + 6 * L * B * H * T^2 * (d_k + d_v)
    cfg = compose_tiny("model.n_layer=3", "model.n_head=2", "model.d_k=5", "model.d_v=7", "train.batch_size=4",
                       "data.seq_len=10")
    assert step_flops(cfg, 1000) == 6 * 1000 * 40 + 6 * 3 * 4 * 2 * 100 * 12


@pytest.mark.gpu
def test_claims_grid_speed_runs_on_the_gpu(tmp_path: Path):
    from benchmarks.claims_grid_speed import main

    data = main(["--smoke", "--device", "cuda", "--out", str(tmp_path / "speed.json")])
    for cell in data["cells"].values():
        assert cell["graph_replayed"] is True and cell["graphed_ms"] > 0 and cell["speedup"] > 0
        assert cell["eager_repeat_max_loss_diff"] >= 0


# ---------------------------------------------------------------- probe_overhead.py


def run_probe_overhead(tmp_path: Path, device: str) -> dict:
    from benchmarks.probe_overhead import main

    out = tmp_path / "probe.json"
    data = main(["--device", device, "--model", "andrea_tiny", "--steps", "20", "--warmup", "5", "--repeats", "2",
                 "--probe-every", "5", "--override", "train.log_every=5", "--override", "probe.maps_every=0",
                 "--override", "train.sample_tokens=0", "--out", str(out)])
    assert json.loads(out.read_text()) == data
    assert data["settings"]["probes_in_timed_steps"] == 3  # steps 5, 10, 15
    assert all(r["status"] == "finished" for runs in data["runs"].values() for r in runs)
    assert len(data["pair_ratios"]) == 2 and data["probe_ms"] > 0 and data["step_ms_probe_off"] > 0
    return data


@pytest.mark.slow
def test_probe_overhead_runs_on_the_cpu(tmp_path: Path):
    assert run_probe_overhead(tmp_path, "cpu")["gpu"] == "cpu"


@pytest.mark.gpu
def test_probe_overhead_runs_on_the_gpu(tmp_path: Path):
    assert run_probe_overhead(tmp_path, "cuda")["gpu"] != "cpu"


# ---------------------------------------------------------------- mask_fill_precision.py (torch on the CPU only)


def test_mask_fill_precision_runs(tmp_path: Path):
    from benchmarks.mask_fill_precision import MAGNITUDES, main

    out = tmp_path / "fill.json"
    data = main(["--out", str(out)])
    assert json.loads(out.read_text())["storage"] == json.loads(json.dumps(data["storage"], default=str))
    fp16 = next(r for r in data["storage"] if r["dtype"] == "fp16")
    assert fp16["cast_of_-1e9"] == float("-inf")  # -1e9 is past fp16's largest finite value, 65504
    assert {r["magnitude"] for r in data["grid"]} == set(MAGNITUDES)


# ---------------------------------------------------------------- investigations/


def run_cell_breakdown(tmp_path: Path, *extra: str) -> dict:
    from benchmarks.investigations.cell_breakdown import main

    out = tmp_path / "breakdown.json"
    data = main(["--smoke", *extra, "--out", str(out), "--set", "model.attn_impl=explicit"])
    assert json.loads(out.read_text()) == data and data["overrides"] == ["model.attn_impl=explicit"]
    assert set(data["cells"]) == {f"d_k={d} {m}" for d in (4, 8) for m in ("causal", "unmasked")}
    for cell in data["cells"].values():
        assert cell["step_ms"] > 0 and cell["eval_s"] > 0 and cell["probe_s"] > 0
    return data


def test_cell_breakdown_runs_on_the_cpu(tmp_path: Path):
    assert run_cell_breakdown(tmp_path)["gpu"] == "cpu"


@pytest.mark.gpu
def test_cell_breakdown_runs_on_the_gpu(tmp_path: Path, capsys):
    assert run_cell_breakdown(tmp_path, "--device", "cuda", "--profile")["gpu"] != "cpu"
    assert "CUDA" in capsys.readouterr().out  # the profile's table of CUDA kernels


def run_probe_breakdown(tmp_path: Path, *extra: str) -> dict:
    from benchmarks.investigations.probe_breakdown import PARTS, main

    out = tmp_path / "probe.json"
    data = main(["--smoke", "--repeats", "1", *extra, "--out", str(out)])
    assert json.loads(out.read_text()) == data
    assert set(data["ms"]) == {*PARTS, "unaccounted"} and all(data["ms"][p] > 0 for p in PARTS)
    assert data["n_layer"] == 2 and data["seq_len"] == 32
    return data


def test_probe_breakdown_runs_on_the_cpu(tmp_path: Path):
    data = run_probe_breakdown(tmp_path)
    assert data["device"] == "cpu" and data["compiled"] is None  # compiling needs a C++ toolchain on the CPU


@pytest.mark.gpu
def test_probe_breakdown_runs_on_the_gpu(tmp_path: Path):
    data = run_probe_breakdown(tmp_path, "--device", "cuda", "--profile")
    assert data["device"] != "cpu" and data["kernels"] and all(k["ms"] >= 0 for k in data["kernels"])
    compiled = data["compiled"]  # on by default on CUDA
    assert compiled["forward_stats_ms"] > 0 and compiled["grad_stats_ms"] > 0
    assert all(diff < 1e-3 for diff in compiled["max_abs_diff_from_eager"].values()), compiled


def run_concurrent_cells(tmp_path: Path, *extra: str) -> dict:
    from benchmarks.investigations.concurrent_cells import main

    out = tmp_path / "cc.json"
    data = main(["--smoke", *extra, "--timeout", "600", "--out", str(out)])
    assert json.loads(out.read_text()) == data and data["d_k"] == [4, 8] and data["steps"] == 3
    assert len(data["alone_ms_per_step"]) == 2 and all(t > 0 for t in data["alone_ms_per_step"])
    assert data["serial_s"] > 0 and data["streams_s"] > 0
    assert data["speedup"] == pytest.approx(data["serial_s"] / data["streams_s"], rel=0.05)  # from unrounded times
    return data


def test_concurrent_cells_runs_on_the_cpu(tmp_path: Path):
    assert run_concurrent_cells(tmp_path)["gpu"] == "cpu"


@pytest.mark.gpu
def test_concurrent_cells_runs_on_the_gpu(tmp_path: Path):
    assert run_concurrent_cells(tmp_path, "--device", "cuda")["gpu"] != "cpu"


def run_grid_wall(tmp_path: Path, *extra: str) -> dict:
    """Two tiny cells through the local_gpus launcher (on the GPU where there is one), plain and with a
    variant's overrides (no probes); the time-stamped phases are in order and every cell finished."""
    from benchmarks.investigations.grid_wall import main

    out = tmp_path / "grid_wall.json"
    data = main(["--smoke", *extra, "--variant", "no_probes probe.every=0", "--out", str(out)])
    assert json.loads(out.read_text()) == data
    for run in data["runs"]:
        assert run["rc"] == 0 and run["failed_lines"] == []
        assert 0 < run["jobs_launched_s"] < run["first_model_built_s"] < run["last_training_ended_s"] < run["wall_s"]
        assert len(run["cells"]) == 2 and all(c["status"] == "finished" and c["wall_s"] > 0
                                              for c in run["cells"].values())
        probes = [c["run/time/probes_s"] for c in run["cells"].values()]
        assert all(p == 0 for p in probes) if run["variant"] == "no_probes" else all(p > 0 for p in probes)
    return data


@pytest.mark.slow
def test_grid_wall_runs_on_the_cpu(tmp_path: Path):
    data = run_grid_wall(tmp_path, "--mps", "false")
    assert [(run["mps"], run["variant"]) for run in data["runs"]] == [("false", "plain"), ("false", "no_probes")]
    assert all(run["mps_lines"] == [] for run in data["runs"])


@pytest.mark.gpu
def test_grid_wall_runs_on_the_gpu(tmp_path: Path):
    data = run_grid_wall(tmp_path)  # mps auto, then false
    assert [run["mps"] for run in data["runs"]] == ["auto", "auto", "false", "false"]


def test_stacked_cells_runs_on_the_cpu(tmp_path: Path):
    from benchmarks.investigations.stacked_cells import main

    data = main(["--smoke", "--out", str(tmp_path / "stacked.json")])
    assert set(data["check_vs_models"]) == {8, 64, 512} and "ms_per_step" not in data
    assert all(c["loss"] < 1e-5 and c["grad_relative"] < 1e-5 for c in data["check_vs_models"].values())


@pytest.mark.gpu
def test_stacked_cells_runs_on_the_gpu(tmp_path: Path):
    from benchmarks.investigations.stacked_cells import main

    data = main(["--d-k", "64", "4096", "--cells", "2", "--steps", "5", "--profile",
                 "--out", str(tmp_path / "stacked.json")])
    assert set(data["ms_per_step"]) == {f"d_k={d} {what}" for d in (64, 4096) for what in ("package cell", "cells=2")}
    assert all(v["ms"] > 0 for v in data["ms_per_step"].values()) and set(data["profiles"]) == set(data["ms_per_step"])


def run_worker_startup(tmp_path: Path, *extra: str) -> dict:
    from benchmarks.investigations.worker_startup import STEPS, main

    out = tmp_path / "startup.json"
    data = main(["--workers", "2", *extra, "--out", str(out)])
    assert json.loads(out.read_text()) == data and len(data["per_worker"]) == 2
    for worker in data["per_worker"]:
        ends = [worker[step] for step in STEPS]
        assert ends == sorted(ends) and ends[0] >= 0
    return data


def test_worker_startup_runs_on_the_cpu(tmp_path: Path):
    assert run_worker_startup(tmp_path, "--smoke")["smoke"] is True


@pytest.mark.gpu
def test_worker_startup_runs_on_the_gpu(tmp_path: Path):
    assert run_worker_startup(tmp_path)["smoke"] is False


@pytest.mark.gpu
def test_attn_fwd_stats_backward_runs_on_the_gpu(tmp_path: Path):
    from benchmarks.investigations.attn_fwd_stats_backward import main

    data = main(["--batch-size", "2", "--out", str(tmp_path / "backward.json")])
    passes = {"sdpa_auto", "sdpa_flash", "sdpa_cudnn", "fused_flash_backward", "fused_cudnn_backward"}
    assert set(data["ms"]) == passes and set(data["grad_max_abs_err_vs_float64"]) == passes
    for name in passes:  # a pass that failed is recorded as an error, not raised
        assert "error" not in data["ms"][name], data["ms"][name]
        assert "error" not in data["grad_max_abs_err_vs_float64"][name], data["grad_max_abs_err_vs_float64"][name]


@pytest.mark.gpu(triton=True)
def test_attn_fwd_stats_configs_runs_on_the_gpu(tmp_path: Path):
    from andrea_exp.model.attn_fwd_stats_kernel import LAUNCH
    from benchmarks.investigations.attn_fwd_stats_configs import main

    data = main(["--batch-size", "2", "--max-configs", "2", "--out", str(tmp_path / "fwd.json")])
    assert json.loads((tmp_path / "fwd.json").read_text()) == data
    assert data["model_launch"] == LAUNCH and data["model_launch_ms"] > 0  # the model's own configuration first
    assert len(data["grid"]) == 2 and all(row["out_max_abs_err"] < 0.05 for row in data["grid"])
    assert all(err < 0.05 for err in data["best"]["stats_max_rel_err"].values())
    for name, ms in data["sdpa_forward_ms"].items():  # a backend that failed is recorded, not raised
        assert isinstance(ms, float) or "error" in ms, (name, ms)


@pytest.mark.gpu
def test_attn_stats_kernel_configs_runs_on_the_gpu(tmp_path: Path):
    from benchmarks.investigations.attn_stats_kernel_configs import main

    data = main(["--batch-size", "2", "--head-dims", "64", "--max-configs", "2", "--out", str(tmp_path / "c.json")])
    entry = data["by_head_dim"]["64"]
    assert 1 <= len(entry["grid"]) <= 2 and entry["sdpa_forward_ms"] > 0
    assert set(entry["variants"]) == {"full", "max_only", "no_entropy", "exp_f16x2"}
    for name, variant in entry["variants"].items():  # a variant that failed is recorded as an error, not raised
        assert "error" not in variant, (name, variant)
    assert all(err < 0.05 for err in entry["variants"]["full"]["max_rel_err"].values())


# ---------------------------------------------------------------- timeline.py (its CPU test: tests/test_timeline.py)


@pytest.mark.gpu
def test_timeline_runs_on_the_gpu(tmp_path: Path):
    """The H200 entries' own path: the default run on the GPU and the claims grid through the local_gpus launcher
    with cells sharing the GPU, every cell's spans read back."""
    from benchmarks.timeline import main

    result = main(["--machine", "test", "--only", "default_run,claims_grid", "--cells-per-gpu", "4",
                   "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "t.json"), "--extra",
                   "train.max_steps=5", "train.eval_every=0", "logger.mode=disabled"])
    assert result["gpu"] is not None
    grid = result["entries"]["claims_grid"]["runs"][0]
    assert len(grid["cells"]) == 12 and all(c["parts"]["steps_s"] > 0 for c in grid["cells"])
    assert result["entries"]["default_run"]["runs"][0]["cells"][0]["parts"]["steps_s"] > 0


# ---------------------------------------------------------------- every script has its GPU test


def test_every_benchmark_script_has_a_gpu_test_that_runs_it():
    """A script in benchmarks/ or benchmarks/investigations/ with no `gpu` test here would stop giving figures
    unnoticed: each must be named by a gpu-marked test of this file (or by a helper such a test calls)."""
    import ast

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    library = {"__init__", "common", "reference_gpt"}  # shared pieces and the reference model, no main of their own
    library.add("mask_fill_precision")  # a dtype grid computed on the CPU by design: its test above runs it anywhere
    scripts = {f"benchmarks.{p.stem}" for p in root.glob("*.py") if p.stem not in library}
    scripts |= {f"benchmarks.investigations.{p.stem}" for p in (root / "investigations").glob("*.py")
                if p.stem != "__init__"}
    source = Path(__file__).read_text()
    functions = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}

    def named(node) -> str:  # the function's text and that of this file's functions it calls
        called = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
        return ast.get_source_segment(source, node) + "".join(
            ast.get_source_segment(source, functions[name]) for name in called & set(functions) - {node.name})

    def is_gpu(node) -> bool:
        return any("mark.gpu" in ast.get_source_segment(source, d) for d in node.decorator_list)

    gpu_text = "".join(named(node) for node in functions.values() if is_gpu(node))
    missing = sorted(s for s in scripts
                     if f"{s} import" not in gpu_text and f"{s.replace('.', '/')}.py" not in gpu_text)
    assert not missing, f"benchmark scripts without a gpu test: {missing}"


def test_packed_qkv_are_views_of_one_tensor_as_the_models_projection_gives_them():
    from benchmarks.common import packed_qkv

    q, k, v = packed_qkv(2, 3, 5, 4, torch.Generator().manual_seed(0))
    packed = torch.randn(2, 5, 3, 3, 4, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    for i, t in enumerate((q, k, v)):
        assert t.shape == (2, 3, 5, 4) and t.dtype == torch.bfloat16 and not t.is_contiguous()
        assert t.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
        assert torch.equal(t, packed[:, :, i].transpose(1, 2))
