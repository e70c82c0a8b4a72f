"""`python -m andrea_exp` and the andrea-exp command: the command starts in andrea_exp/launch/startup.py, which
imports the Hydra app inside its Ctrl-C guard."""

from andrea_exp.launch.startup import main

if __name__ == "__main__":
    main()
