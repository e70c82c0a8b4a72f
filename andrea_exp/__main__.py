"""`python -m andrea_exp` and the andrea-exp command: the Hydra app in andrea_exp/launch/cli.py, imported inside
launch/startup.py's Ctrl-C guard, so that an interrupt while torch and Hydra load ends in one line too."""

from andrea_exp.launch.startup import start_up_guard
from andrea_exp.runs import timeline


def main() -> None:
    timeline.mark("main")  # the interpreter is up: what came before is the process's start
    with start_up_guard(), timeline.span("imports"):
        from andrea_exp.launch.cli import main as command
    command()


if __name__ == "__main__":
    main()
