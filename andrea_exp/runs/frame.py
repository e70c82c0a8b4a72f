"""Runs on disk as data: one row per run, or every logged value in long form; and a finished sweep's table.

    andrea-exp-runs SWEEP_DIR [--csv FILE]      (or python -m andrea_exp.runs)

    from andrea_exp import runs
    table = runs.load("multirun/claims_grid/2026-05-01_12-00-00")          # one row per run
    history = runs.load("multirun/claims_grid/...", history=True)          # path, step, key, value

pandas is optional (`pip install pandas`); only `load` and `--csv` need it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from andrea_exp.config.errors import describe_os_error, describe_unwritable, unwritable
from andrea_exp.runs import reader, rundir, table, tracking
from andrea_exp.runs.metric_keys import RUN_STATUS

CONFIG_PREFIX = "config."
HISTORY_COLUMNS = ("path", "step", "key", "value")


def _pandas():
    try:
        import pandas
    except ImportError:
        raise ImportError("andrea_exp.runs.load needs pandas: pip install pandas") from None
    return pandas


def run_row(run_dir: Path) -> dict:
    """One run as a flat record: path, status, its summary values, and its config as `config.<dotted key>`."""
    return _row(reader.read_run(run_dir, records=False))


def history_rows(run_dir: Path) -> list[tuple]:
    """(path, step, key, value) for every number in metrics.jsonl; text (e.g. samples) is left out."""
    return _history(reader.read_run(run_dir))


def _row(run: reader.Run) -> dict:
    summary = {k: v for k, v in run.summary.items() if k != "config"}
    row = {"path": str(run.path), "status": summary.pop(RUN_STATUS, None)}
    row.update(summary)
    row.update({CONFIG_PREFIX + k: v for k, v in run.config.items()})
    return row


def _history(run: reader.Run) -> list[tuple]:
    rows = []
    for record in run.records:
        step = record.get("step")
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                rows.append((str(run.path), step, key, float(value)))
    return rows


def load(*dirs, history: bool = False):
    """Runs under the given run or sweep directories as a pandas DataFrame.

    history=False: one row per run (columns path, status, the summary's keys, config.<dotted key>).
    history=True: one row per logged number (columns path, step, key, value), in file order.
    """
    pandas = _pandas()
    if not dirs:
        raise ValueError("runs.load needs at least one run or sweep directory")
    found = reader.find_runs(*dirs, records=history)  # the reader the report uses too
    if history:
        return pandas.DataFrame([r for run in found for r in _history(run)], columns=list(HISTORY_COLUMNS))
    return pandas.DataFrame([_row(run) for run in found])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="andrea-exp-runs",
                                     description="Reprint a finished sweep's table of cells; optionally as CSV.")
    parser.add_argument("sweep_dir", type=Path, metavar="SWEEP_DIR", help="the sweep's directory (hydra.sweep.dir)")
    parser.add_argument("--csv", type=Path, metavar="FILE", help="also write one row per run to FILE (needs pandas)")
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        print(f"error: SWEEP_DIR {args.sweep_dir} is not a directory", file=sys.stderr)
        return 2
    blocked = None if args.csv is None else unwritable(args.csv.expanduser().absolute().parent)
    if blocked is not None:  # before reading any run
        print(f"error: --csv {args.csv} cannot be written: {describe_unwritable(blocked)}", file=sys.stderr)
        return 2
    cells = table.read_cells(args.sweep_dir)
    if not cells:
        print(f"error: {args.sweep_dir} holds no job directories (none with {rundir.HYDRA_DIR}/)", file=sys.stderr)
        return 2
    print(table.sweep_report(args.sweep_dir, cells))
    if (args.sweep_dir / tracking.SWEEP_WANDB_DIR).is_dir():
        print(tracking.sweep_commands(args.sweep_dir))
    if args.csv is not None:
        try:
            frame = load(*(cell["dir"] for cell in cells))
        except ImportError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        try:
            frame.to_csv(args.csv, index=False)
        except OSError as err:  # a full disk, a name that is a directory
            print(f"error: --csv: {describe_os_error(err)}", file=sys.stderr)
            return 1
        print(f"wrote {len(frame)} runs to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
