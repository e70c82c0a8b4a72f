"""Shared fixtures: a fresh run directory and a way to run the real CLI as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def cli_env() -> dict:
    """The environment a CLI subprocess runs in: W&B offline and quiet, Hydra's short errors."""
    env = dict(os.environ)
    env["WANDB_MODE"] = "offline"
    env["WANDB_SILENT"] = "true"
    env.pop("HYDRA_FULL_ERROR", None)
    return env


def run_cli(*overrides: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m andrea_exp OVERRIDES...` from the repository root; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "andrea_exp", *overrides], cwd=REPO_ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=timeout)


def data_error_line(cfg, seq_len: int) -> str:
    """The one-line error check_data raises for a `data` config, checked to be the line build_dataset
    raises too (a caller that skips validation still gets it)."""
    import re

    from andrea_exp.config.data_checks import check_data
    from andrea_exp.config.validation import ConfigError
    from andrea_exp.data.sources import build_dataset

    with pytest.raises(ConfigError) as caught:
        check_data(cfg, seq_len)
    message = str(caught.value)
    assert "\n" not in message
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_dataset(cfg, seq_len=seq_len, seed=0)
    return message


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """An empty directory to pass as hydra.run.dir."""
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def cli():
    """The run_cli helper, as a fixture for tests that prefer injection."""
    return run_cli
