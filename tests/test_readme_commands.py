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
