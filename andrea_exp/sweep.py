"""Sweeps: what a cell is called (W&B group, run name, tags) and, at the end, one table of every cell."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

_failed: list[str] = []
MAX_TAG = 64  # W&B's limit on a tag's length


# ---------------------------------------------------------------- naming a cell


@dataclass
class JobContext:
    group: str                      # one value for every job of a multirun
    run_name: str                   # the overrides that differ between cells, shortened
    axes: list[tuple[str, str]] = field(default_factory=list)  # (override key, value) of this cell
    in_sweep: bool | None = None    # None: not started by Hydra


def _split_override(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    # the sweeper writes booleans as Python does (True); show them as the user types them
    return key.lstrip("+~"), {"True": "true", "False": "false"}.get(value, value)


def swept_keys(task_overrides: list[str], sweeper_params: dict | None) -> set[str]:
    """Keys that take several values in a sweep: `key=a,b` on the command line or in hydra.sweeper.params."""
    keys = set((sweeper_params or {}).keys())
    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    keys.update(o.key_or_group for o in parsed if o.is_sweep_override())
    return keys


def _sweep_master(sweep_dir: Path) -> tuple[list[str], dict]:
    """The sweep's own command line, from the multirun.yaml Hydra writes before launching any job."""
    path = sweep_dir / "multirun.yaml"
    if not path.exists():
        return [], {}
    master = OmegaConf.load(path)
    task = list(OmegaConf.select(master, "hydra.overrides.task", default=[]) or [])
    params = OmegaConf.select(master, "hydra.sweeper.params", default=None)
    return task, (OmegaConf.to_container(params) if params is not None else {})


def short_key(key: str, keys: list[str]) -> str:
    """model.d_k -> d_k, unless two keys share their last part."""
    last = key.rsplit(".", 1)[-1]
    return last if sum(k.rsplit(".", 1)[-1] == last for k in keys) == 1 else key


def run_name(axes: list[tuple[str, str]]) -> str:
    keys = [k for k, _ in axes]
    return ",".join(f"{short_key(k, keys)}={v}" for k, v in axes)


def job_context(run_dir: Path) -> JobContext:
    """Group, run name and axes of the Hydra job writing run_dir (or of a plain directory outside Hydra)."""
    run_dir = Path(run_dir)
    if not HydraConfig.initialized():
        return JobContext(group="-".join(run_dir.resolve().parts[-2:]), run_name=run_dir.name)
    hc = HydraConfig.get()
    task = [str(o) for o in hc.overrides.task]
    if hc.mode == RunMode.MULTIRUN:
        sweep_dir = Path(str(hc.sweep.dir))
        master_task, master_params = _sweep_master(sweep_dir)
        params = OmegaConf.to_container(hc.sweeper.params) if hc.sweeper.get("params") else {}
        keys = swept_keys(master_task, {**master_params, **params})
        axes = [_split_override(o) for o in task if _split_override(o)[0] in keys]
        name = run_name(axes) or f"job{hc.job.num}"
        return JobContext("-".join(sweep_dir.resolve().parts[-2:]), name, axes, in_sweep=True)
    axes = [_split_override(o) for o in task]
    return JobContext("-".join(run_dir.resolve().parts[-2:]), run_name(axes) or run_dir.name, axes, in_sweep=False)


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
        if key not in ("model.d_k", "model.scale", "model.causal"):
            tags.append(f"{short_key(key, keys)}={value}")
    tags.extend(str(t) for t in extra)
    return list(dict.fromkeys(t[:MAX_TAG] for t in tags))


# ---------------------------------------------------------------- the end-of-sweep table


def failed_cells() -> list[str]:
    """Cells of the last sweep in this process that failed (diverged cells are results, not failures)."""
    return list(_failed)


def read_cells(sweep_dir: Path) -> list[dict]:
    """Every job directory of a sweep with its overrides (only the swept ones when known) and summary."""
    from andrea_exp.tracking import read_summary  # tracking imports this module

    master_task, master_params = _sweep_master(Path(sweep_dir))
    keys = swept_keys(master_task, master_params) if (master_task or master_params) else set()
    cells = []
    for job_dir in sorted((p for p in Path(sweep_dir).iterdir() if (p / ".hydra").is_dir()),
                          key=lambda p: (len(p.name), p.name)):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = [line[2:].strip() for line in overrides_file.read_text().splitlines() if line.startswith("- ")]
        pairs = [_split_override(o) for o in overrides]
        overrides = [f"{k}={v}" for k, v in pairs if not keys or k in keys]
        cells.append({"dir": job_dir, "overrides": " ".join(overrides), "summary": read_summary(job_dir)})
    return cells


def _num(summary: dict, key: str) -> str:
    value = summary.get(key)
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def format_table(cells: list[dict]) -> str:
    header = ("cell", "overrides", "status", "final loss", "gap", "entropy")
    rows = [header]
    for cell in cells:
        s = cell["summary"]
        rows.append((cell["dir"].name, cell["overrides"] or "(defaults)", s.get("run/status", "?"),
                     _num(s, "eval/loss_as_trained"), _num(s, "eval/gap"), _num(s, "attn/entropy")))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    notes = []
    for c in cells:
        status, error = c["summary"].get("run/status"), c["summary"].get("run/error")
        if status == "missing":
            notes.append(f"  cell {c['dir'].name}: no summary.json (the job died before writing one)")
        elif status in ("failed", "diverged") and error:
            notes.append(f"  cell {c['dir'].name} {status}: {error}")
    return "\n".join(lines + (["notes:", *notes] if notes else []))


class SweepSummary(Callback):
    """Says once how W&B logs the sweep; at the end prints the table of every cell and remembers failures."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _failed.clear()
        from andrea_exp.tracking import offline_notice, resolve_mode

        mode, why = resolve_mode(str(OmegaConf.select(config, "logger.mode", default="auto")))
        if mode == "offline":
            sweep_dir = config.hydra.sweep.dir
            print(offline_notice(why, f"{sweep_dir}/*/wandb/offline-run-*", f"{sweep_dir}/0/wandb"), flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        cells = read_cells(sweep_dir) if sweep_dir.is_dir() else []
        _failed.clear()
        _failed.extend(c["dir"].name for c in cells if c["summary"].get("run/status") in ("failed", "missing"))
        print(f"\n[andrea-exp] sweep {sweep_dir}: {len(cells)} cells, {len(_failed)} failed")
        print(format_table(cells), flush=True)
