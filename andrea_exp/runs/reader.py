"""Run directories read back: the one reader behind the runs DataFrame (runs.frame: `runs.load`,
`andrea-exp-runs --csv`) and the report (report.runs).

`read_run` reads a run's files once, through rundir, into a `Run`: its summary.json (non-finite values as
floats; {"run/status": "missing"} when it wrote none), its resolved config flattened to dotted keys with
model.scale spelled one way, and its metrics.jsonl records. `find_runs` walks roots for them (rundir.find_run_dirs).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from andrea_exp.runs import metric_keys as mk
from andrea_exp.runs.rundir import (
    HYDRA_DIR,
    METRICS_FILE,
    SUMMARY_FILE,
    DamagedRun,
    find_run_dirs,
    flatten,
    parse_number,
    read_config,
    read_metrics,
    read_summary,
)


@dataclass
class Run:
    path: Path
    config: dict  # flattened, resolved config
    summary: dict
    records: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.summary.get(mk.RUN_STATUS, "missing"))

    @property
    def seed(self):
        return self.config.get("seed")

    @property
    def experiment(self):
        """The experiment's name from the config (`name`), e.g. claims_grid."""
        return self.config.get("name")

    @property
    def sweep(self) -> Path:
        """The sweep the run belongs to: Hydra puts a multirun's jobs side by side in one directory."""
        return self.path.parent

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, in logged order."""
        steps, values = [], []
        for record in self.records:
            if key in record and isinstance(record[key], (int, float)):
                steps.append(record["step"])
                values.append(float(record[key]))
        return steps, values

    def at_step(self, key: str, step: int) -> float | None:
        for record in self.records:
            if record.get("step") == step and isinstance(record.get(key), (int, float)):
                return float(record[key])
        return None

    def last(self, key: str) -> float | None:
        """The final value: from summary.json, else the last logged one."""
        value = parse_number(self.summary.get(key))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        _, values = self.series(key)
        return values[-1] if values else None

    def probe_at_end(self, key: str) -> float | None:
        """The probe value at the last step the probe ran."""
        steps, values = self.series(key)
        return values[-1] if values and steps[-1] > 0 else None

    def initial_loss(self) -> float | None:
        """l_0: the training loss at step 0, else the uniform guess log V."""
        value = self.at_step(mk.TRAIN_LOSS, 0)
        if value is not None and math.isfinite(value):
            return value
        log_vocab = self.summary.get(mk.DATA_LOG_VOCAB)
        return float(log_vocab) if isinstance(log_vocab, (int, float)) else None


def read_run(run_dir: Path, records: bool = True) -> Run:
    """One run directory as a Run; records=False leaves metrics.jsonl unread (records stay []). A summary.json
    or a metrics.jsonl that cannot be the run's (metrics_damage) raises DamagedRun naming the file."""
    summary = read_summary(run_dir)
    config = flatten(read_config(run_dir, summary))
    logged: list[dict] = []
    if records:
        unreadable: list[int] = []
        logged = read_metrics(run_dir, unreadable)
        damage = metrics_damage(summary, logged, unreadable)
        if damage is not None:
            raise DamagedRun(f"{Path(run_dir) / METRICS_FILE} {damage}")
    return Run(run_dir, config, summary, logged)


def metrics_damage(summary: dict, records: list[dict], unreadable: list[int]) -> str | None:
    """Why metrics.jsonl cannot be the whole log of a run whose summary.json was written, or None. The summary
    is written after the log is closed, so a run that wrote one has no line cut short; and a finished run
    logged its final evaluation at its last step, run/steps."""
    status = summary.get(mk.RUN_STATUS)
    if status not in ("finished", "diverged", "interrupted"):
        return None  # no summary (a kill), or a failed run: its log may stop anywhere
    if unreadable:
        lines = ", ".join(map(str, unreadable[:3])) + (", ..." if len(unreadable) > 3 else "")
        return f"has {len(unreadable)} unreadable line(s) (line {lines}) although the run {status}: the file was cut"
    steps = summary.get(mk.RUN_STEPS)
    last = max((r["step"] for r in records if isinstance(r.get("step"), int)), default=None)
    if status == "finished" and isinstance(steps, int) and records and last is not None and last < steps:
        return f"ends at step {last}, but summary.json records a run finished after {steps} steps: the file was cut"
    return None


def read_runs(paths, records: bool = True, damaged: list[str] | None = None) -> list[Run]:
    """The runs of the directories `paths`, in order; a damaged one is left out with one line on stderr (also
    appended to `damaged` when given), and the others are read."""
    runs = []
    for path in paths:
        try:
            runs.append(read_run(path, records))
        except DamagedRun as err:
            print(f"[andrea-exp] skipped a damaged run: {err}", file=sys.stderr, flush=True)
            if damaged is not None:
                damaged.append(str(err))
    return runs


def has_logged(run_dir: Path) -> bool:
    """Hydra started the run (`.hydra/`) and it wrote a summary or metrics file: what the report counts as a run."""
    path = Path(run_dir)
    return (path / HYDRA_DIR).is_dir() and any((path / name).is_file() for name in (SUMMARY_FILE, METRICS_FILE))


def find_runs(*roots: Path, records: bool = True) -> list[Run]:
    """Every run under the roots (rundir.find_run_dirs: each root that is a run, else the runs below it), read;
    damaged ones left out with a line each (read_runs)."""
    return read_runs(find_run_dirs(*roots), records)
