"""Atomic checkpoints that hold no code: tensors and plain values only, loaded with weights_only=True.

A checkpoint at step S holds the state after S optimiser updates, plus what the loop needs to carry on
as if it had never stopped: the random streams, the divergence watch, the best evaluation so far, and
the records already logged at step S (the evaluation that runs just before the save), which the
resumed run writes back because metrics.jsonl is cut at step S.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from omegaconf import MISSING, OmegaConf

from andrea_exp.config.schema import is_scientific, recorded_default
from andrea_exp.config.validation import ConfigError
from andrea_exp.config.variants import canonical_scale
from andrea_exp.runs.rundir import canonical_config, flatten

LATEST = "latest.pt"
BEST = "best.pt"
STEP_PREFIX = "step-"
SCALE_KEY = "model.scale"


class CheckpointError(ConfigError):
    """A checkpoint that cannot be read or does not fit this run; the message is one line."""


def rng_state() -> dict:
    version, mt_words, gauss_next = random.getstate()
    state = {"torch": torch.get_rng_state(), "python": list(mt_words), "python_version": version,
             "python_gauss": gauss_next}
    np_state = np.random.get_state()
    # numpy's MT19937 keys as an int64 tensor: plain data, so weights_only loading accepts it
    state["numpy"] = {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                      "has_gauss": int(np_state[3]), "gauss": float(np_state[4])}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        for index, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):  # fewer GPUs now is fine
            torch.cuda.set_rng_state(cuda_state, index)


def save(directory: Path, *, step: int, model, optimizer, scheduler, extra: dict) -> Path:
    """Write checkpoints/latest.pt atomically: temporary file, flush, fsync, rename. A kill or a full
    disk during the write leaves the previous checkpoint in place."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "rng": rng_state(), "extra": extra}
    target = directory / LATEST
    tmp = directory / (LATEST + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            writer = _RecordingWriter(fh)
            try:
                torch.save(payload, writer)
            except RuntimeError as err:  # torch reports a failed write as "[enforce fail at inline_container.cc...]"
                if writer.error is None:
                    raise
                raise writer.error from err
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:  # a full disk, a quota: the one line names the checkpoint, not the temporary file
        tmp.unlink(missing_ok=True)  # don't leave a partial file filling the disk
        err.filename, err.filename2 = str(target), None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    _fsync_dir(directory)  # make the rename itself durable
    return target


class _RecordingWriter:
    """The file torch.save writes through, keeping the OSError of a failed write (torch raises its own
    RuntimeError instead, which names neither the file nor the cause)."""

    def __init__(self, fh):
        self.fh, self.error = fh, None

    def write(self, data) -> int:
        try:
            return self.fh.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.fh.flush()


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not sync directories; the rename is still atomic
    finally:
        os.close(fd)


def load(directory: Path, map_location="cpu") -> dict | None:
    """The latest checkpoint in `directory`, or None when there is none."""
    target = directory / LATEST
    if not target.exists():
        return None
    try:
        return torch.load(target, map_location=map_location, weights_only=True)
    except Exception as err:  # a truncated file, or one holding code (refused by weights_only)
        detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"train.resume: cannot read the checkpoint {target} ({detail}); "
                              "delete it to start the run afresh") from None


def restore(state: dict, *, model, optimizer, scheduler, max_steps: int, path: Path) -> None:
    """Load model, optimiser and schedule from `state`; refuse a checkpoint that does not fit this run."""
    saved_max = state["extra"].get("max_steps")
    if saved_max is not None and saved_max != max_steps:
        raise CheckpointError(f"train.max_steps must equal the checkpoint's ({saved_max}) to resume {path}: "
                              f"the learning-rate schedule depends on it; got {max_steps}")
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        raise CheckpointError(f"train.resume: the checkpoint {path} holds a different model than model.* "
                              f"describes ({first[1].strip() if len(first) > 1 else first[0]}); resume with "
                              "the run's own settings (see its .hydra/overrides.yaml)") from None
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])


# ---------------------------------------------------------------- the settings a resume must keep


def scientific_settings(cfg) -> dict:
    """The resolved config flattened to dotted keys, scientific settings only (`schema.is_scientific`)."""
    flat = flatten(canonical_config(OmegaConf.to_container(cfg, resolve=True)))
    return {key: value for key, value in sorted(flat.items())
            if is_scientific(key)}


def check_settings(saved: dict | None, current: dict, path: Path) -> None:
    """One line naming every scientific setting that differs from the checkpoint's (old -> new)."""
    if saved is None:
        return  # a checkpoint written before settings were recorded: nothing to compare
    if SCALE_KEY in saved:  # recorded as typed (true or "sqrt") before settings were spelled one way
        saved = {**saved, SCALE_KEY: canonical_scale(saved[SCALE_KEY])}
    earlier = {key: recorded_default(key) for key in current if key not in saved}  # settings added since the save
    saved = {**{key: value for key, value in earlier.items() if value is not MISSING}, **saved}
    changed = [f"{key} {saved.get(key, '(unset)')} -> {current.get(key, '(unset)')}"
               for key in sorted(set(saved) | set(current)) if saved.get(key) != current.get(key)]
    if changed:
        raise CheckpointError(f"train.resume: settings differ from the checkpoint {path}: {', '.join(changed)}; "
                              "resume with the run's own settings, or start a new run")


# ---------------------------------------------------------------- step and best copies


def _link_or_copy(source: Path, target: Path) -> None:
    """target becomes the content of source now (a hard link when the file system allows it), atomically."""
    tmp = target.with_name(target.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def keep_copies(directory: Path, step: int, keep: int, is_best: bool) -> None:
    """After a save: step-SSSSSSS.pt for this step, the oldest beyond `keep` removed; best.pt when is_best."""
    latest = directory / LATEST
    _link_or_copy(latest, directory / f"{STEP_PREFIX}{step:07d}.pt")
    for old in sorted(directory.glob(f"{STEP_PREFIX}*.pt"))[:-keep]:
        old.unlink()
    if is_best:
        _link_or_copy(latest, directory / BEST)
