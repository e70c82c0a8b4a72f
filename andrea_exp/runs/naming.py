"""What a run is called: its W&B group, run name and tags, from the overrides that differ between cells.

Naming only: it reads Hydra's job state and the sweep's command line (through rundir), and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from andrea_exp.config.choices import canonical_scale
from andrea_exp.runs import rundir

MAX_TAG = 64  # W&B's limit on a tag's length
AXIS_TAGS = ("model.d_k", "model.scale", "model.causal")  # tagged by value even when not swept


@dataclass
class JobContext:
    group: str                      # one value for every job of a multirun
    run_name: str                   # the overrides that differ between cells, shortened
    axes: list[tuple[str, str]] = field(default_factory=list)  # (override key, value) of this cell
    in_sweep: bool | None = None    # None: not started by Hydra


def split_override(text: str) -> tuple[str, str]:
    """`+model.d_k=True` -> ("model.d_k", "true"): key without Hydra's prefix, value as the user types it;
    model.scale spelled one way however it was typed (`model.scale=true` -> ("model.scale", "sqrt"))."""
    key, _, value = text.partition("=")
    key = key.lstrip("+~")
    if key == "model.scale":
        return key, str(canonical_scale(value))
    # the sweeper writes booleans as Python does (True); show them as the user types them
    return key, {"True": "true", "False": "false"}.get(value, value)


def swept_keys(task_overrides: list[str], sweeper_params: dict | None) -> set[str]:
    """Keys that take several values in a sweep: `key=a,b` on the command line or in hydra.sweeper.params."""
    keys = set((sweeper_params or {}).keys())
    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    keys.update(o.key_or_group for o in parsed if o.is_sweep_override())
    return keys


def sweep_axes(sweep_dir: Path) -> set[str]:
    """The swept keys of a finished sweep directory; empty when its multirun.yaml is gone."""
    task, params = rundir.read_sweep_command(sweep_dir)
    return swept_keys(task, params) if (task or params) else set()


def short_key(key: str, keys: list[str]) -> str:
    """model.d_k -> d_k, unless two keys share their last part."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def run_name(axes: list[tuple[str, str]]) -> str:
    keys = [k for k, _ in axes]
    return ",".join(f"{short_key(k, keys)}={v}" for k, v in axes)


def _group_of(directory: Path) -> str:
    """A directory's last two parts joined by "-": multirun/claims_grid/<ts> -> claims_grid-<ts>."""
    return "-".join(Path(directory).resolve().parts[-2:])


def job_context(run_dir: Path) -> JobContext:
    """Group, run name and axes of the Hydra job writing run_dir (or of a plain directory outside Hydra)."""
    run_dir = Path(run_dir)
    if not HydraConfig.initialized():
        return JobContext(group=_group_of(run_dir), run_name=run_dir.name)
    hc = HydraConfig.get()
    task = [str(o) for o in hc.overrides.task]
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = Path(str(hc.sweep.dir))
        master_task, master_params = rundir.read_sweep_command(sweep_dir)
        params = OmegaConf.to_container(hc.sweeper.params) if hc.sweeper.get("params") else {}
        keys = swept_keys(master_task, {**master_params, **params})
        axes = [split_override(o) for o in task if split_override(o)[0] in keys]
        return JobContext(_group_of(sweep_dir), run_name(axes) or f"job{hc.job.num}", axes, in_sweep=True)
    axes = [split_override(o) for o in task]
    return JobContext(_group_of(run_dir), run_name(axes) or run_dir.name, axes, in_sweep=False)


def _on_off(value) -> str:
    text = str(value).lower()
    return {"true": "on", "sqrt": "on", "false": "off", "none": "off"}.get(text, text)


def run_tags(cfg, axes: list[tuple[str, str]], extra: list[str]) -> list[str]:
    """One tag per axis value: d_k=64, scale=on, mask=off; then the other swept keys; then logger.tags."""
    model = cfg.get("model") or {}
    tags = []
    if "d_k" in model:
        tags.append(f"d_k={model.d_k}")
    if "scale" in model:
        tags.append(f"scale={_on_off(model.scale)}")
    if "causal" in model:
        tags.append(f"mask={_on_off(model.causal)}")
    keys = [k for k, _ in axes]
    for key, value in axes:
        if key not in AXIS_TAGS:
            tags.append(f"{short_key(key, keys)}={value}")
    tags.extend(str(t) for t in extra)
    return list(dict.fromkeys(t[:MAX_TAG] for t in tags))
