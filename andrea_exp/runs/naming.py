"""What a run is called in W&B. Group: the cell (every scientific setting but the seed), so seeds of one cell
average together and different cells never do. Name and tags: d_k, divisor and mask, every other scientific
setting the command line gives, and the seed, as typed in the config (`d_k=64 scale=none causal=true lr=0.01
seed=1`). A sweep's runs also carry the sweep's name (experiment and time) as a tag and a config key.

Naming only: it reads Hydra's job state and the sweep's command line (through rundir), and writes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import OmegaConf

from andrea_exp.config.schema import is_scientific
from andrea_exp.config.variants import canonical_scale
from andrea_exp.runs import rundir

MAX_TAG = 64  # W&B's limit on a tag's length


@dataclass
class JobContext:
    """What the W&B run of one job is called (see `describe`)."""
    group: str                      # the cell: every scientific setting but the seed
    run_name: str                   # d_k, divisor, mask, the other settings given, seed
    tags: list[str] = field(default_factory=list)
    sweep: str | None = None        # the sweep's name (experiment and time); None for a single run
    sweep_dir: Path | None = None
    in_sweep: bool | None = None    # None: not started by Hydra
    overrides: list[str] | None = None  # the job's own command-line overrides (a sweep's cell: its values only)


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
    """[("model.d_k", "64"), ("train.lr", "0.01")] -> "d_k=64 lr=0.01": settings as typed on the command line."""
    keys = [k for k, _ in axes]
    return " ".join(f"{short_key(k, keys)}={v}" for k, v in axes)


AXES = ("model.d_k", "model.scale", "model.causal")  # named first in every run name, given or not
NOT_SETTINGS = ("experiment",)  # a preset's name, not a setting: its settings are in the run's config
MAX_GROUP = 128  # W&B's limit on a group's length


def _value(cfg, key: str, typed: str) -> str:
    """A setting's value in the config's vocabulary: as resolved (model.scale spelled sqrt / none / inv, booleans
    true / false), or as typed for a config group (`model=andrea_small`)."""
    value = OmegaConf.select(cfg, key, default=None)
    if key == "model.scale" and value is not None:
        return str(canonical_scale(value))
    if isinstance(value, bool):
        return str(value).lower()
    if value is None or OmegaConf.is_config(value):
        return typed
    return str(value)


def cell_settings(cfg) -> dict:
    """Every scientific setting of a resolved config, dotted: the seed and the operational settings left out."""
    config = rundir.canonical_config(OmegaConf.to_container(cfg, resolve=True)) if OmegaConf.is_config(cfg) else cfg
    return {k: v for k, v in rundir.flatten(config).items() if is_scientific(k)}


def cell_axes(cfg, overrides: list[str]) -> list[tuple[str, str]]:
    """(key, value) of the cell: d_k, divisor, mask, then every other scientific setting the overrides give."""
    axes = [(key, _value(cfg, key, "")) for key in AXES if OmegaConf.select(cfg, key, default=None) is not None]
    for key, typed in map(split_override, overrides):
        if key not in AXES and key not in NOT_SETTINGS and key != "seed" and is_scientific(key):
            axes.append((key, _value(cfg, key, typed)))
    return list(dict.fromkeys(axes))


def group_of(cfg, axes: list[tuple[str, str]]) -> str:
    """The cell as a W&B group: its settings as named, then a hash of every scientific setting, so seeds of one
    cell share the group and two cells never do, whatever the overrides named."""
    digest = hashlib.sha256(json.dumps(cell_settings(cfg), sort_keys=True, default=str).encode()).hexdigest()[:8]
    readable = run_name(axes)[: MAX_GROUP - len(digest) - 3]
    return f"{readable} #{digest}" if readable else f"#{digest}"


def sweep_name(sweep_dir: Path) -> str:
    """The sweep as its runs record it: the experiment's name (else `sweep_` and its swept keys), then the sweep
    directory's own name, the time it started in hydra.sweep.dir's default (`claims_grid-2026-12-01_10-00-00`).
    Read from the directory alone, so a resumed cell and the workspace find the same name."""
    sweep_dir = Path(sweep_dir)
    master = sweep_dir / rundir.MULTIRUN_FILE
    name = OmegaConf.select(OmegaConf.load(master), "name", default=None) if master.is_file() else None
    if not name or name == "default":
        keys = list(sweep_axes(sweep_dir))
        name = "_".join(["sweep", *sorted(short_key(k, keys) for k in keys)])
    return f"{name}-{sweep_dir.resolve().name}"


def describe(cfg, overrides: list[str], sweep: str | None = None, extra_tags: list[str] = ()) -> JobContext:
    """Group, run name and tags of a run with this resolved config and these command-line overrides."""
    axes = cell_axes(cfg, overrides)
    named = axes + ([("seed", str(cfg.seed))] if OmegaConf.select(cfg, "seed", default=None) is not None else [])
    keys = [k for k, _ in named]
    tags = [f"{short_key(k, keys)}={v}" for k, v in named]
    tags += [f"sweep={sweep}"] if sweep else []
    tags += [str(t) for t in extra_tags]
    return JobContext(group=group_of(cfg, axes), run_name=run_name(named), sweep=sweep,
                      tags=list(dict.fromkeys(t[:MAX_TAG] for t in tags)))


def job_context(cfg, extra_tags: list[str] = ()) -> JobContext:
    """Naming of the Hydra job now running (or of a run started outside Hydra: no overrides, no sweep)."""
    if not HydraConfig.initialized():
        return describe(cfg, [], extra_tags=extra_tags)
    hc = HydraConfig.get()
    overrides = [str(o) for o in hc.overrides.task]
    if hc.mode != RunMode.MULTIRUN:
        return dataclasses.replace(describe(cfg, overrides, extra_tags=extra_tags), in_sweep=False,
                                   overrides=overrides)
    sweep_dir = Path(str(hc.sweep.dir))
    context = describe(cfg, overrides, sweep=sweep_name(sweep_dir), extra_tags=extra_tags)
    return dataclasses.replace(context, sweep_dir=sweep_dir, in_sweep=True, overrides=overrides)
