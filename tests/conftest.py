"""Shared fixtures: a fresh run directory, a way to run the real CLI as a subprocess, the one way tests
compose conf/ (Hydra's own compose API: compose_config, compose_tiny), the tiny preset composed once with a
per-test copy (tiny_config), a group's shipped settings as the schema's dataclass (data_settings, probe_settings),
the one GPU condition (the `gpu` marker) and a .tar.gz written from members in memory."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"

# The tiny preset: a one-layer 32-wide model on 16-token sequences of a small built-in chain, no probes,
# logging or progress bar. Tests add what they need (steps, cadences, device) through tiny().
TINY = ("logger.mode=disabled", "model.d_model=32", "model.n_layer=1", "model.block_size=16", "data.seq_len=16",
        "data.train_sequences=64", "data.eval_sequences=8", "train.batch_size=8", "probe.every=0",
        "train.progress=false")


def tiny(*changes: str) -> list[str]:
    """The tiny preset's overrides with CHANGES: a change to a key the preset sets replaces that override in
    place, any other is added at the end (so the effective values are those of the preset followed by CHANGES)."""
    def key(override: str) -> str:
        return override.split("=", 1)[0]

    overrides = list(TINY)
    for change in changes:
        at = [i for i, o in enumerate(overrides) if key(o) == key(change)]
        if at:
            overrides[at[0]] = change
        else:
            overrides.append(change)
    return overrides


def compose_config(*overrides: str, hydra: bool = False):
    """conf/config.yaml composed with OVERRIDES as the app composes it (Hydra's initialize_config_dir +
    compose); hydra=True keeps the `hydra` node (launcher, sweeper)."""
    from hydra import compose, initialize_config_dir

    import andrea_exp.config.schema  # noqa: F401  registers base_config, the schema the yaml files extend

    with initialize_config_dir(version_base="1.3", config_dir=str(CONF_DIR)):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def compose_tiny(*changes: str):
    """The tiny preset with CHANGES, composed."""
    return compose_config(*tiny(*changes))


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


@pytest.fixture(scope="package")
def composed_tiny():
    """The tiny preset composed once for the test package, read-only: a test changes its own copy, tiny_config."""
    from omegaconf import OmegaConf

    cfg = compose_tiny()
    OmegaConf.set_readonly(cfg, True)
    return cfg


@pytest.fixture
def tiny_config(composed_tiny):
    """A deep copy of the composed tiny preset for one test to change. It stays typed by the schema: an
    unknown key or a value of the wrong type is refused as it is set, as Hydra refuses the override."""
    import copy

    from omegaconf import OmegaConf

    cfg = copy.deepcopy(composed_tiny)
    OmegaConf.set_readonly(cfg, False)
    return cfg


@pytest.fixture
def cli():
    """The run_cli helper, as a fixture for tests that prefer injection."""
    return run_cli


def make_archive(path: Path, members: dict[str, bytes]) -> Path:
    """A .tar.gz at path holding each name -> bytes of members, in that order."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def slurm_unavailable() -> str | None:
    """Why the tests marked `slurm` cannot run here, in one line, or None when a SLURM cluster answers."""
    why = os.environ.get("ANDREA_SLURM_UNAVAILABLE")  # set by .ci/run when tests/slurm/start_cluster.sh failed
    if why:
        return why
    if shutil.which("sbatch") is None:
        return "no SLURM here (sbatch not found); as root, tests/slurm/start_cluster.sh --install starts one"
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no SLURM cluster answers (sinfo: {err}); tests/slurm/start_cluster.sh starts one"
    if proc.returncode != 0 or not any(s in proc.stdout for s in ("idle", "mixed", "allocated")):
        said = (proc.stderr.strip().splitlines() or ["no node takes jobs"])[-1]
        return f"no SLURM cluster answers (sinfo: {said}); tests/slurm/start_cluster.sh starts one"
    return None


def gpu_skip_reason(marker, cuda: bool, triton_interpreter: bool, triton: bool = True) -> str | None:
    """Why a test marked `gpu` cannot run here, or None. gpu(triton=True): a test of a Triton kernel, which
    also needs Triton; gpu(triton_interpreter=True): a Triton kernel's test which also runs on the CPU under
    Triton's interpreter (TRITON_INTERPRET=1)."""
    on_cpu = marker.kwargs.get("triton_interpreter", False)
    if not (cuda or (triton_interpreter and on_cpu)):
        return "needs a CUDA device"
    if (on_cpu or marker.kwargs.get("triton", False)) and not triton:
        return "needs Triton"
    return None


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if "slurm" in item.keywords]
    why = slurm_unavailable() if marked else None
    for item in marked if why else []:
        item.add_marker(pytest.mark.skip(reason=why))
    # the one GPU condition: the `gpu` marker skips by itself without CUDA, so no test restates the check
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        import torch  # only when a GPU test was collected: the rest of the suite need not load torch to collect

        cuda, interpreter = torch.cuda.is_available(), os.environ.get("TRITON_INTERPRET") == "1"
        from andrea_exp.model.step_stats import triton_available

        triton = triton_available()
        for item in gpu:
            why = gpu_skip_reason(item.get_closest_marker("gpu"), cuda, interpreter, triton)
            if why:
                item.add_marker(pytest.mark.skip(reason=why))


def data_settings(source: str, **changes):
    """The shipped settings of a data source (conf/data/SOURCE.yaml) with CHANGES, as the typed group the
    data sources read; a yaml's unset `???` stays a string, as a test of the refusal needs it."""
    from omegaconf import OmegaConf

    from andrea_exp.config.schema import DataSchema

    shipped = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "data" / f"{source}.yaml"), throw_on_missing=False)
    return DataSchema(**{**shipped, **changes})


def probe_settings(**changes):
    """The shipped probe settings (conf/probe/default.yaml) with CHANGES, as the typed group Probe reads."""
    import dataclasses

    from omegaconf import OmegaConf

    from andrea_exp.config.schema import ProbeSchema

    return dataclasses.replace(ProbeSchema(**OmegaConf.load(CONF_DIR / "probe" / "default.yaml")), **changes)
