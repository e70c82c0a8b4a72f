"""`python -m andrea_exp.report SWEEP_DIR... --out DIR` and the `andrea-report` console script."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from andrea_exp.report.markdown import NoRuns, write_report


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="andrea-report",
                                     description="runs on disk -> report.md with a verdict per claim, and figures")
    parser.add_argument("sweep_dirs", nargs="+", help="sweep or run directories (searched recursively)")
    parser.add_argument("--out", required=True, type=Path, help="directory for report.md and figures/")
    parser.add_argument("--machine", help="the machine the runs ran on, stated in the header for runs whose "
                        "summary.json does not record system/gpu (e.g. 'NVIDIA H200')")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the header, e.g. the commit the runs were made with (repeatable)")
    args = parser.parse_args(argv)
    missing = [d for d in args.sweep_dirs if not Path(d).is_dir()]
    if missing:
        parser.error(f"SWEEP_DIR must be existing directories; not found: {', '.join(missing)}")
    try:
        path = write_report(args.sweep_dirs, args.out, ["andrea-report", *argv], args.machine, args.note)
    except NoRuns as err:
        sys.exit(f"andrea-report: {err}")  # one line, exit status 1
    print(f"[andrea-report] wrote {path}")


if __name__ == "__main__":
    main()
