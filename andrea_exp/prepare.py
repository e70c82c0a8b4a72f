"""`python -m andrea_exp.prepare`: the command lives in andrea_exp/data/prepare.py."""

from andrea_exp.data.prepare import main

if __name__ == "__main__":
    raise SystemExit(main())  # its status: non-zero on an error
