"""Console entry point: `andrea-exp` / `python -m andrea_exp` is the Hydra app (`-m` sweeps)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from andrea_exp import devices, sweep, tracking
from andrea_exp.config import ConfigError, command_line_error, validate
from andrea_exp.schema import CONF_DIR
from andrea_exp.tracking import write_summary

devices.register_resolver()  # before Hydra composes conf/hydra/launcher/local_gpus.yaml


def _fmt(value, spec=".4f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_run_summary(summary: dict, run_dir: Path) -> None:
    loss = summary.get("eval/loss_as_trained")
    print(f"[andrea-exp] {summary['run/status']} after {summary['run/steps']} steps "
          f"in {summary.get('run/wall_s', 0):.1f} s")
    print(f"  held-out loss {_fmt(loss)} | floor {_fmt(summary.get('eval/floor'))} | "
          f"log V {_fmt(summary.get('data/log_vocab'))} (uniform guess) | "
          f"generation loss {_fmt(summary.get('eval/loss_generation'))} | gap {_fmt(summary.get('eval/gap'))}")
    print(f"  files: {run_dir}/metrics.jsonl, summary.json, checkpoints/")


def run_job(cfg: DictConfig) -> dict:
    """One Hydra job. In a sweep a failing cell is recorded and the sweep goes on."""
    hydra_cfg = HydraConfig.get()
    in_sweep = hydra_cfg.mode == RunMode.MULTIRUN
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        validate(cfg)
    except ConfigError as err:
        write_summary(run_dir, {"run/status": "failed", "run/error": str(err), "run/steps": 0}, cfg)
        print(f"error: {err}", file=sys.stderr)
        if in_sweep:
            return {"run/status": "failed"}
        sys.exit(2)
    if in_sweep and "joblib" in str(hydra_cfg.launcher.get("_target_", "")):
        device = devices.assign_device(cfg, Path(hydra_cfg.sweep.dir), hydra_cfg.job.num)  # before CUDA starts
        if device is not None:
            cfg.train.device = device
    from andrea_exp.train import train  # torch import kept out of config errors' path

    try:
        summary = train(cfg, run_dir)
    except Exception as err:
        tracking.finish_open_runs(failed=True)  # never let this job's W&B run leak into the next job
        if isinstance(err, ConfigError) and not in_sweep:  # e.g. a checkpoint that does not fit: files untouched
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        if _summary_status(run_dir) != "failed":  # keep the tracker's fuller failure summary when it wrote one
            write_summary(run_dir, {"run/status": "failed", "run/error": f"{type(err).__name__}: {err}",
                                    "run/steps": 0}, cfg)
        if not in_sweep:
            raise
        print(f"error: cell {hydra_cfg.job.num} failed: {type(err).__name__}: {err}", file=sys.stderr)
        return {"run/status": "failed"}
    if summary.get("train/world_size", 1) == 1 or _is_rank_zero():
        print_run_summary(summary, run_dir)
    return summary


def _summary_status(run_dir: Path) -> str | None:
    try:
        return tracking.read_summary(run_dir).get("run/status")
    except (OSError, ValueError):
        return None


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


_app = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(run_job)


def main() -> None:
    # bad settings as one line before Hydra makes a run directory (HYDRA_FULL_ERROR=1 keeps Hydra's own report)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not any(a.startswith("hydra.run.dir=") for a in sys.argv[1:]):
        # each process would stamp its own time into the default run directory
        print("error: hydra.run.dir must be given under torchrun so every process shares one run directory "
              "(e.g. hydra.run.dir=runs/ddp)", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("HYDRA_FULL_ERROR") != "1":
        problem = command_line_error(sys.argv[1:], CONF_DIR)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            sys.exit(2)
    _app()
    if sweep.failed_cells():
        sys.exit(1)
