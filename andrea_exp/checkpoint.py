"""Atomic checkpoints that hold no code: tensors and plain values only, loaded with weights_only=True."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

LATEST = "latest.pt"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
             "python_version": random.getstate()[0], "python_gauss": random.getstate()[2]}
    np_state = np.random.get_state()
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
        torch.cuda.set_rng_state_all(state["cuda"])


def save(directory: Path, *, step: int, model, optimizer, scheduler, extra: dict) -> Path:
    """Write checkpoints/latest.pt atomically: temporary file, flush, fsync, rename."""
    directory.mkdir(parents=True, exist_ok=True)
    payload = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
               "scheduler": scheduler.state_dict(), "rng": rng_state(), "extra": extra}
    target = directory / LATEST
    tmp = directory / (LATEST + ".tmp")
    with open(tmp, "wb") as fh:
        torch.save(payload, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return target


def load(directory: Path, map_location="cpu") -> dict | None:
    target = directory / LATEST
    if not target.exists():
        return None
    return torch.load(target, map_location=map_location, weights_only=True)
