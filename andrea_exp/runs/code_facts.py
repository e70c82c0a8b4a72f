"""Which code made a run or a report: the git commit and whether tracked files were edited, and a fingerprint
of the source that holds without git; free of torch, so the report asks them without loading the model."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from andrea_exp.config.schema import CONF_DIR
from andrea_exp.runs import metric_keys as K

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
