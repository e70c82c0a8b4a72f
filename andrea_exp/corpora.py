"""`python -m andrea_exp.corpora`: the command lives in andrea_exp/data/corpora.py."""

from andrea_exp.data.corpora import main

if __name__ == "__main__":
    raise SystemExit(main())  # its status: non-zero on an error
