"""Shared by the benchmarks: compose a run config with Hydra's API and read a run's throughput back."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=overrides)


def build_cell(cfg):
    """(runtime, data on its device, model, step, attention statistics) for one run config, built as train()
    builds them: the statistics (train.attn_stats) enabled before the step, since a CUDA graph or a compiled
    model captures their buffers, then the step (a CUDA graph where train.cuda_graph allows one)."""
    import torch

    from andrea_exp.data.sources import build_dataset
    from andrea_exp.instruments import attn_stats
    from andrea_exp.training.loop import build_model, build_optimizer, build_step, wrap_for_training
    from andrea_exp.training.runtime import setup_runtime

    rt = setup_runtime(cfg)
    torch.manual_seed(cfg.seed)
    data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed).to(rt.device)
    model = build_model(cfg, data.vocab_size).to(rt.device)
    optimizer, scheduler = build_optimizer(model, cfg, rt.device)
    stats = attn_stats.from_config(cfg, model)  # before the step: it adds buffers to the model
    params = [p for p in model.parameters() if p.requires_grad]
    step = build_step(cfg, rt, wrap_for_training(model, cfg, rt), params, optimizer, scheduler, cfg.train.grad_clip)
    return rt, data, model, step, stats


def warmed_cell(cfg, timed_steps: int, warmup_steps: int = 5):
    """build_cell's (runtime, data, model, step) after `warmup_steps` steps (the eager warm-up and, where
    the step is graphed, its capture), with the next `timed_steps` batches already on the device."""
    from andrea_exp.training.loop import local_batch_size

    rt, data, model, step, _ = build_cell(cfg)
    bs = local_batch_size(cfg.train.batch_size, 1)
    batches = [data.batch(i, bs, cfg.seed, 0, 1) for i in range(warmup_steps + timed_steps)]
    for x, y in batches[:warmup_steps]:
        step(x, y)
    return rt, data, model, step, batches[warmup_steps:]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def steady_throughput(run_dir: Path, skip_steps: int) -> dict:
    """Tokens/s over the logging windows that start after `skip_steps` (warm-up and compilation excluded).

    Each window's time is tokens / rate, so the overall rate is total tokens / total time, not a mean of rates.
    """
    rows = [r for r in read_metrics(run_dir) if "train/tokens_per_s" in r]
    tokens_prev, total_tokens, total_time = None, 0.0, 0.0
    for r in rows:
        if tokens_prev is not None and r["step"] >= skip_steps:
            window_tokens = r["train/tokens"] - tokens_prev
            total_tokens += window_tokens
            total_time += window_tokens / r["train/tokens_per_s"]
        tokens_prev = r["train/tokens"]
    if total_time == 0:
        raise RuntimeError(f"no timed windows after step {skip_steps} in {run_dir}")
    return {"tokens_per_s": total_tokens / total_time, "timed_tokens": total_tokens, "timed_s": total_time}


def git_commit(tree: Path | None = None) -> str:
    """The checkout's commit (this one's, or `tree`'s), so a committed figure says which code produced it."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=tree or Path(__file__).resolve().parent)
    return done.stdout.strip() if done.returncode == 0 else "unknown (not a git checkout)"


def timed(fn, repeats: int, sync) -> float:
    """Mean seconds of fn() over `repeats` calls, after one untimed call (allocator, kernels chosen)."""
    fn()
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - started) / repeats


def write_result(path: Path | None, result: dict) -> None:
    """The benchmark's JSON at `path` (folders made as needed); nothing when no path was asked for."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
