"""`python -m andrea_exp`: the andrea-exp command (the Hydra app in andrea_exp/launch/cli.py)."""

from andrea_exp.launch.cli import main

if __name__ == "__main__":
    main()
