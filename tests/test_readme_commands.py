"""The README's test command works as typed (plain `pytest`, not `python -m pytest`), and CI runs exactly it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def readme_command(after: str) -> str:
    """The indented command that follows the line `after` in the README's "Two commands" section."""
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    start = lines.index(after)
    return next(line.strip() for line in lines[start + 1:] if line.startswith("    "))


def test_ci_runs_the_readme_test_command_verbatim():
    command = readme_command("Run the tests:")
    assert command == 'pip install -e ".[dev]" && pytest -n auto --dist loadfile'
    ci_lines = [line.strip() for line in (REPO_ROOT / ".ci" / "run").read_text().splitlines()]
    assert any(line == command or line.startswith(command + " ||") for line in ci_lines), ci_lines


def test_plain_pytest_collects_every_test_file():
    """`pytest` (the console script) puts only tests/ on sys.path unless pyproject says otherwise; the tests
    that import benchmarks/ then fail to collect."""
    script = Path(sys.executable).parent / "pytest"
    if not script.exists():
        pytest.skip("no pytest console script beside this Python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    args = [str(script), "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_stacked_cells.py"]
    done = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ModuleNotFoundError" not in done.stdout + done.stderr


def readme_section(title: str) -> str:
    text = (REPO_ROOT / "README.md").read_text()
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_slurm_command_and_settings_are_accepted_before_anything_is_submitted():
    """Each command the SLURM section shows, and each hydra.launcher setting it names with a value, passes the
    checks the launcher makes before it submits (the command line's settings, the request itself)."""
    import re
    import shlex

    from conftest import compose_config

    from andrea_exp.config.schema import CONF_DIR
    from andrea_exp.config.validation import command_line_error
    from andrea_exp.launch.slurm import request_refusal

    section = readme_section("SLURM")
    commands = re.findall(r"^    (andrea-exp .*?)(?<!\\)$", section.replace("\\\n", " "), flags=re.M)
    settings = re.findall(r"`(\+?hydra\.launcher\.[\w.]+=[^`\s]+)`", section)
    assert len(commands) == 1 and "hydra.launcher.on_interrupt=cancel" in settings, (commands, settings)
    for argv in [shlex.split(c)[1:] for c in commands] + [["-m", "hydra/launcher=slurm", s] for s in settings]:
        assert command_line_error(argv, CONF_DIR) is None, argv
        params = compose_config(*[a for a in argv if a != "-m"], hydra=True).hydra.launcher
        assert request_refusal(dict(params), sinfo=None) is None, argv
