"""`python -m andrea_exp.report SWEEP_DIR... [--out DIR]` and the `andrea-report` console script."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from andrea_exp.runs import timeline

DEFAULT_OUT = "report"  # beside the runs: SWEEP_DIR/report for one directory, ./report for several


def default_out(sweep_dirs: list[str]) -> Path:
    return Path(sweep_dirs[0]) / DEFAULT_OUT if len(sweep_dirs) == 1 else Path(DEFAULT_OUT)


def main(argv: list[str] | None = None) -> None:
    timeline.mark("main")  # the interpreter is up: what came before is the process's start
    # the report's modules (torch among them) load here, not at this module's import: the figures' worker
    # processes are spawned, and each imports the main module again before it draws
    with timeline.span("imports"):
        from andrea_exp.config.errors import describe_os_error, unwritable
        from andrea_exp.report.markdown import NoRuns, write_report
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="andrea-report",
                                     description="runs on disk -> report.md with a verdict per claim, and figures")
    parser.add_argument("sweep_dirs", nargs="+", help="sweep or run directories (searched recursively)")
    parser.add_argument("--out", type=Path, help="directory for report.md and figures/ (default: SWEEP_DIR/report "
                        "for one directory, ./report for several)")
    parser.add_argument("--machine", help="the machine the runs ran on, stated in the header for runs whose "
                        "summary.json does not record system/gpu (e.g. 'NVIDIA H200')")
    parser.add_argument("--note", action="append", default=[],
                        help="a line for the header, e.g. the commit the runs were made with (repeatable)")
    args = parser.parse_args(argv)
    files = [d for d in args.sweep_dirs if Path(d).exists() and not Path(d).is_dir()]
    if files:
        parser.error(f"SWEEP_DIR must be directories of runs; these are files: {', '.join(files)}")
    missing = [d for d in args.sweep_dirs if not Path(d).exists()]
    if missing:
        parser.error(f"SWEEP_DIR must be existing directories; not found: {', '.join(missing)}")
    out = args.out
    if out is None:
        out = default_out(args.sweep_dirs)
        print(f"[andrea-report] no --out given: writing to {out}", flush=True)
    problem = unwritable(out)
    if problem is not None:  # before reading any run: say so at once
        sys.exit(f"andrea-report: cannot write {out} (--out): {problem.strerror or type(problem).__name__}")
    try:
        path = write_report(args.sweep_dirs, out, ["andrea-report", *argv], args.machine, args.note)
    except NoRuns as err:
        sys.exit(f"andrea-report: {err}")  # one line, exit status 1
    except OSError as err:  # a disk that fills while the report is written
        sys.exit(f"andrea-report: {describe_os_error(err)}")
    print(f"[andrea-report] wrote {path}")


if __name__ == "__main__":
    main()
