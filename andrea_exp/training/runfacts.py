"""Facts about a run that are not measurements of training (the code's git commit and whether it was
edited, the number of processes, the parameter count, the GPU, torch and CUDA versions, log(vocab)), put in
the summary so a result can be traced to the code and machine that made it; a module of its own because
these ask the outside world (git, the CUDA driver), not the training."""

from __future__ import annotations

import hashlib
import math
import subprocess
from pathlib import Path

import torch

from andrea_exp.config.schema import CONF_DIR
from andrea_exp.model.decoder import Andrea
from andrea_exp.runs import metric_keys as K
from andrea_exp.training.runtime import Runtime

PACKAGE_DIR = Path(__file__).resolve().parent.parent


def git_facts(here: Path = PACKAGE_DIR, ignore: Path | None = None) -> dict:
    """The code's commit and whether tracked files differ from it; None for both outside a git checkout.
    `ignore`: a directory whose changes do not count (a report regenerating its own committed outputs)."""

    def git(*args) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    pathspec = []
    top = git("rev-parse", "--show-toplevel") if commit and ignore is not None else None
    if top:
        left_out, root = Path(ignore).resolve(), Path(top).resolve()
        if left_out.is_relative_to(root):
            pathspec = ["--", ":/", f":(top,exclude){left_out.relative_to(root).as_posix()}"]
    dirty = git("status", "--porcelain", "--untracked-files=no", *pathspec) if commit else None
    return {K.RUN_GIT_COMMIT: commit, K.RUN_GIT_DIRTY: None if dirty is None else bool(dirty)}


def code_sha(package: Path = PACKAGE_DIR, conf: Path = CONF_DIR) -> str:
    """12 hex digits of SHA-256 over every .py file of the package and every .yaml of the configs, each
    with its path relative to its root: two runs with the same value ran the same source."""
    digest = hashlib.sha256()
    for root, pattern in ((package, "*.py"), (conf, "*.yaml")):
        for file in sorted(p for p in Path(root).rglob(pattern) if "__pycache__" not in p.parts):
            digest.update(f"{root.name}/{file.relative_to(root).as_posix()}\0".encode())
            digest.update(file.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:12]


def run_facts(rt: Runtime, model: Andrea, vocab_size: int) -> dict:
    gpu = torch.cuda.get_device_name(rt.device) if rt.device.type == "cuda" else "cpu"
    # plain str: a TorchVersion in a cell's result would make the sweep's launching process import torch
    version = str(torch.__version__)
    return {K.TRAIN_WORLD_SIZE: rt.world_size, K.MODEL_PARAMS: model.num_params(), K.SYSTEM_GPU: gpu,
            K.SYSTEM_TORCH: version, K.SYSTEM_CUDA: torch.version.cuda,
            K.DATA_LOG_VOCAB: math.log(vocab_size), K.RUN_CODE_SHA: code_sha(), **git_facts()}
