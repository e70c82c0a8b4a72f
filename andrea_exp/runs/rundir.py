"""The run directory's files: their names, `metrics.jsonl` and `summary.json` writers and readers, the W&B id file,
the overrides Hydra recorded, and which directories of a sweep are runs.

Everything the training loop leaves on disk for the sweep table, the report and users' scripts goes
through here, so the file formats live in one place.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from omegaconf import OmegaConf

from andrea_exp.config.schema import fill_later_settings
from andrea_exp.config.variants import canonical_scale

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
RUN_ID_FILE = "wandb_run_id"
CHECKPOINT_DIR = "checkpoints"
MAPS_DIR = "attention_maps"
HYDRA_DIR = ".hydra"
MULTIRUN_FILE = "multirun.yaml"  # Hydra writes it in the sweep directory before launching any job
NON_FINITE = ("nan", "inf", "+inf", "-inf", "infinity", "-infinity")


def jsonable(value):
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no nan/inf; keep them readable
    return value


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"model": {"d_k": 64}} -> {"model.d_k": 64}: a config as the dotted keys users type."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def canonical_config(config: dict) -> dict:
    """A resolved config (nested dicts) with model.scale spelled one way however it was typed (true or "sqrt"
    -> "sqrt": variants.canonical_scale) and the scientific settings added since the run was recorded at their
    defaults (schema.fill_later_settings), so that summaries, the runs table and W&B group it as one value."""
    config = fill_later_settings(config)
    model = config.get("model")
    if isinstance(model, dict) and "scale" in model:
        return {**config, "model": {**model, "scale": canonical_scale(model["scale"])}}
    return config


def parse_number(value):
    """metrics.jsonl stores non-finite floats as strings; give them back as floats."""
    if isinstance(value, str) and value.strip().lower() in NON_FINITE:
        return float(value)
    return value


class MetricsFile:
    """Append-only `metrics.jsonl`: one JSON object per line, each with `step`."""

    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = path
        self._failed = False  # a write failed (e.g. a full disk): closing may fail the same way
        if resume_step is None:
            self.path.write_text("")
        else:
            self._truncate_after(resume_step)
        self._fh = open(self.path, "a", buffering=1)

    def _truncate_after(self, step: int) -> None:
        """Drop lines written after the checkpoint so a resumed run neither repeats nor skips a step."""
        if not self.path.exists():
            self.path.write_text("")
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if record.get("step", -1) < step:
                kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def write(self, metrics: dict, step: int) -> None:
        record = {"step": step, **{k: jsonable(v) for k, v in metrics.items()}}
        try:
            self._fh.write(json.dumps(record) + "\n")
        except OSError as err:
            self._failed = True
            raise naming_path(err, self.path) from None

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError:
            if not self._failed:
                raise
            # the line that failed is still buffered and fails again; the error was already raised once


def naming_path(err: OSError, path: Path) -> OSError:
    """The same error with `path` as its file name: a failed write() on an open file names no file."""
    if err.filename is not None:
        return err
    named = type(err)(err.errno, err.strerror or str(err), str(path))
    named.__traceback__ = err.__traceback__
    return named


class DamagedRun(ValueError):
    """A run file that cannot be what it should be (a summary.json that is no JSON object, a metrics.jsonl cut
    short); the message is one line that names the file. Readers of many runs report it and go on."""


def read_metrics(run_dir: Path, unreadable: list[int] | None = None) -> list[dict]:
    """Every record of metrics.jsonl, non-finite values as floats; a line cut short by a kill is skipped
    (its line number appended to `unreadable` when given)."""
    path = Path(run_dir) / METRICS_FILE
    records = []
    if not path.exists():
        return records
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(line)
        except ValueError:  # JSONDecodeError, or a line that is no object
            if unreadable is not None:
                unreadable.append(number)
            continue
        records.append({k: parse_number(v) for k, v in record.items()})
    return records


def write_summary(run_dir: Path, summary: dict, cfg) -> None:
    """summary.json at the top of the run directory, written atomically, with the resolved config."""
    summary = {k: jsonable(v) for k, v in summary.items()}
    summary["config"] = canonical_config(OmegaConf.to_container(cfg, resolve=True))
    target = Path(run_dir) / SUMMARY_FILE
    tmp = target.with_name(SUMMARY_FILE + ".tmp")
    try:
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, target)
    except OSError as err:  # name the file the user knows, not the temporary one, and leave no part of it behind
        tmp.unlink(missing_ok=True)
        raise type(err)(err.errno, err.strerror or str(err), str(target)) from None


def read_summary(run_dir: Path) -> dict:
    """summary.json of a run directory, non-finite values as floats (as read_metrics gives them);
    a run that never wrote one reads as {"run/status": "missing"}; one that cannot be read raises DamagedRun."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.exists():
        return {"run/status": "missing"}
    try:
        summary = json.loads(path.read_text())
    except OSError as err:
        raise DamagedRun(f"{path} cannot be read ({err.strerror or type(err).__name__})") from None
    except ValueError as err:  # not JSON, or not UTF-8: a write cut short, a full disk
        raise DamagedRun(f"{path} is not valid JSON ({err}); the run's summary is lost") from None
    if not isinstance(summary, dict):
        raise DamagedRun(f"{path} holds a JSON {type(summary).__name__}, not the run's summary object")
    return {k: parse_number(v) for k, v in summary.items()}


def read_run_id(run_dir: Path) -> str | None:
    """The W&B run id stored in the run directory, or None when there is none yet."""
    path = Path(run_dir) / RUN_ID_FILE
    text = path.read_text().strip() if path.exists() else ""
    return text or None


def write_run_id(run_dir: Path, run_id: str) -> None:
    (Path(run_dir) / RUN_ID_FILE).write_text(run_id + "\n")


def read_overrides(run_dir: Path) -> list[str]:
    """The overrides Hydra recorded for the job (`.hydra/overrides.yaml`), as typed: ["model.d_k=64", ...]."""
    path = Path(run_dir) / HYDRA_DIR / "overrides.yaml"
    if not path.exists():
        return []
    return [str(o) for o in (OmegaConf.load(path) or [])]


def read_sweep_command(sweep_dir: Path) -> tuple[list[str], dict]:
    """The sweep's own overrides and sweeper params, from its multirun.yaml; ([], {}) when there is none."""
    path = Path(sweep_dir) / MULTIRUN_FILE
    if not path.exists():
        return [], {}
    master = OmegaConf.load(path)
    task = list(OmegaConf.select(master, "hydra.overrides.task", default=[]) or [])
    params = OmegaConf.select(master, "hydra.sweeper.params", default=None)
    return task, (OmegaConf.to_container(params) if params is not None else {})


def read_config(run_dir: Path, summary: dict | None = None) -> dict:
    """The run's resolved config: from summary.json (`summary` when already read), else Hydra's
    `.hydra/config.yaml` (unresolved), else {}."""
    config = (read_summary(run_dir) if summary is None else summary).get("config")
    if not isinstance(config, dict):
        path = Path(run_dir) / HYDRA_DIR / "config.yaml"
        config = OmegaConf.to_container(OmegaConf.load(path), resolve=False) if path.exists() else {}
    return canonical_config(config)  # runs written before summaries spelled model.scale one way


def is_run_dir(path: Path) -> bool:
    """A run directory: Hydra's `.hydra/`, or a summary or metrics file at its top."""
    path = Path(path)
    return any((path / name).exists() for name in (HYDRA_DIR, SUMMARY_FILE, METRICS_FILE))


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The job directories of one sweep (those Hydra wrote `.hydra/` into), in job order: 0, 1, ..., 10."""
    return sorted((p for p in Path(sweep_dir).iterdir() if (p / HYDRA_DIR).is_dir()), key=_natural)


def _natural(path: Path) -> tuple:
    """Hydra numbers jobs 0, 1, ..., 10: sort by number, then by name."""
    return (0, int(path.name), "") if path.name.isdigit() else (1, 0, path.name)


SKIP_DIRS = frozenset({"wandb", CHECKPOINT_DIR, MAPS_DIR, HYDRA_DIR})  # never hold a run of their own


def find_run_dirs(*roots: Path) -> list[Path]:
    """Each root that is a run, else every run below it (W&B, checkpoint and map folders are not searched)."""
    skip = SKIP_DIRS
    found: list[Path] = []
    for root in map(Path, roots):
        if not root.is_dir():
            raise FileNotFoundError(f"no such run or sweep directory: {root}")
        if is_run_dir(root):
            found.append(root)
            continue
        below = [p for p in sorted(root.iterdir(), key=_natural) if p.is_dir() and p.name not in skip]
        found.extend(find_run_dirs(*below) if below else [])
    return list(dict.fromkeys(found))
