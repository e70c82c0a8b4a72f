"""Runs on disk -> Run objects, through the one reader of run directories (andrea_exp.runs.reader), which also
serves the runs DataFrame: the resolved config (flattened), summary.json and metrics.jsonl of each run.

The report counts as a run every directory under the given paths that Hydra started (`.hydra/`) and that wrote
a summary or metrics file, in path order; nothing here needs W&B.
"""

from __future__ import annotations

from pathlib import Path

from andrea_exp.runs.reader import Run, has_logged, read_run, read_runs
from andrea_exp.runs.rundir import find_run_dirs as _walk

__all__ = ["Run", "find_run_dirs", "load_run", "load_runs"]


def load_run(run_dir: Path) -> Run:
    return read_run(run_dir)


def find_run_dirs(roots) -> list[Path]:
    """Every directory under the roots with `.hydra/` and a summary or a metrics file (a run), sorted by path."""
    roots = list(map(Path, roots))
    for root in roots:
        if not root.exists():
            raise FileNotFoundError(f"no such directory: {root}")
    return sorted({path for path in _walk(*(r for r in roots if r.is_dir())) if has_logged(path)})


def load_runs(roots, damaged: list[str] | None = None) -> list[Run]:
    """The runs under the roots; a damaged one is left out with one line naming its file (reader.read_runs)."""
    return read_runs(find_run_dirs(roots), damaged=damaged)
