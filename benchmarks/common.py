"""Shared by the benchmarks: compose a run config with Hydra's API, train a run's cell step by step as the loop does,
and read a run's throughput back."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_cfg(overrides: list[str]):
    """The run's settings as train() reads them: composed, then validated into their dataclasses."""
    from andrea_exp.config.validation import validate

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return validate(compose(config_name="config", overrides=overrides))


class CellRun:
    """A run's cell (andrea_exp.training.cell) trained one step at a time as train()'s loop takes a step: the
    probe when due (with a run directory for its maps), the step's batch, the attention statistics around the
    step, and every train.log_every steps the loop's one host sync (its LogWindow) and the statistics' rows.
    Keeps each step's loss and the last statistics row; evaluation, checkpoints and logging are left out."""

    def __init__(self, cfg, run_dir: Path | None = None):
        from andrea_exp.training.cell import build_cell
        from andrea_exp.training.logwindow import LogWindow
        from andrea_exp.training.loop import build_probe

        self.cell = build_cell(cfg)
        self.probe = None if run_dir is None else build_probe(cfg.probe, self.cell.model,
                                                              self.cell.data.eval.tokens, run_dir, self.cell.rt)
        self.probe_cfg, self.batch_size, self.seed = cfg.probe, cfg.train.batch_size, cfg.seed
        self.log_every = cfg.train.log_every
        self.window = LogWindow(cfg.tokens_per_step, cfg.train.grad_clip, z_loss=self.cell.model.z_loss)
        self.step_no, self.probes_run, self.losses, self.last_row = 0, 0, [], {}

    def step(self, with_probe: bool = True) -> None:
        from andrea_exp.training.loop import probe_due

        if with_probe and self.probe is not None and probe_due(self.step_no, self.probe_cfg):
            self.probe.measure(self.step_no)
            self.probes_run += 1
        x, y = self.cell.data.batch(self.step_no, self.batch_size, self.seed)
        self.cell.stats.before_step(self.step_no)
        self.window.add(self.step_no, *self.cell.step(x, y))
        self.cell.stats.after_step(self.step_no)
        self.step_no += 1
        if len(self.window) >= self.log_every:
            self.flush()

    def flush(self) -> None:
        """The loop's host sync and the rows it logs."""
        from andrea_exp.runs.metric_keys import TRAIN_LOSS

        self.losses.extend(row[TRAIN_LOSS] for _, row in self.window.flush())
        rows = self.cell.stats.flush()
        if rows:
            self.last_row = {"step": max(rows), **rows[max(rows)]}


def warmed_cell(cfg, timed_steps: int, warmup_steps: int = 5):
    """(cell, batches): build_cell's cell after `warmup_steps` steps (the eager warm-up and, where the step is
    graphed, its capture), with the next `timed_steps` batches already on the device."""
    from andrea_exp.training.cell import build_cell
    from andrea_exp.training.loop import local_batch_size

    cell = build_cell(cfg)
    bs = local_batch_size(cfg.train.batch_size, 1)
    batches = [cell.data.batch(i, bs, cfg.seed, 0, 1) for i in range(warmup_steps + timed_steps)]
    for x, y in batches[:warmup_steps]:
        cell.step(x, y)
    return cell, batches[warmup_steps:]


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


def packed_qkv(B: int, H: int, T: int, d: int, generator):
    """q, k, v (B, H, T, d) in bf16 as the model's fused projection gives them: views of one (B, T, 3, H, d) tensor
    drawn from `generator` on its device."""
    import torch

    packed = torch.randn(B, T, 3, H, d, device=generator.device, dtype=torch.bfloat16, generator=generator)
    return tuple(packed[:, :, i].transpose(1, 2) for i in range(3))
