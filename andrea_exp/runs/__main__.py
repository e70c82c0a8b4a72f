"""`python -m andrea_exp.runs`: the andrea-exp-runs command (runs on disk as a table, andrea_exp/runs/frame.py)."""

from andrea_exp.runs.frame import main

if __name__ == "__main__":
    raise SystemExit(main())  # its status: non-zero on an error
