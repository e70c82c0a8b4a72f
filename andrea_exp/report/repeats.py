"""The data box's lines about passes over the training data: which runs repeated it (`data/epochs` above 1,
andrea_exp.data.epochs) and which the report cannot tell about (runs from before `data/epochs` was recorded)."""

from __future__ import annotations

from collections.abc import Callable

from andrea_exp.data.epochs import repeats
from andrea_exp.report.memorisation import memorised_warning
from andrea_exp.report.runs import Run
from andrea_exp.runs import metric_keys as mk


def run_label(run: Run) -> str:
    """`[experiment] d_k 64 scale none causal True lr 0.0006 seed 0`: one run in a warning line."""
    c = run.config
    return (f"[{run.experiment}] d_k {c.get('model.d_k')} scale {c.get('model.scale')} causal "
            f"{c.get('model.causal')} lr {c.get('train.lr')} seed {run.seed}")


def epochs_of(run: Run) -> float | None:
    return run.last(mk.DATA_EPOCHS)


def repeat_warning(runs: list[Run], label: Callable[[Run], str] = run_label) -> str | None:
    """One line naming the runs that passed over their training data more than once, with their epochs."""
    found = [(run, epochs_of(run)) for run in runs]
    over = [(run, e) for run, e in found if repeats(e)]
    unknown = sum(e is None for _, e in found)
    parts = []
    if over:
        parts.append(f"{len(over)} of {len(runs)} runs passed over their training data more than once (data/epochs "
                     "> 1; their held-out losses may read memorising as stalling): "
                     + "; ".join(f"{label(run)}: {e:.2f} epochs" for run, e in over))
    if unknown:
        parts.append(f"{unknown} runs do not record data/epochs: whether they repeated their data is unknown")
    return ". ".join(parts) or None


def data_warnings(runs: list[Run], label: Callable[[Run], str] = run_label) -> list[str]:
    """The data box's warnings about repeated data and memorised runs (andrea_exp.report.memorisation)."""
    return [w for w in (repeat_warning(runs, label), memorised_warning(runs, label)) if w]


def epochs_text(runs: list[Run]) -> str:
    """The most passes any of the runs made over its training data, and how many runs repeated it."""
    values = [e for e in map(epochs_of, runs) if e is not None]
    if not values:
        return "not recorded"
    over = sum(map(repeats, values))
    unknown = len(runs) - len(values)
    return (f"{max(values):.2f} at most; " + (f"{over} of {len(runs)} runs above 1" if over else "no run above 1")
            + (f"; {unknown} not recorded" if unknown else ""))


def train_tokens_text(runs: list[Run]) -> str:
    values = sorted({int(v) for v in (r.last(mk.DATA_TRAIN_TOKENS) for r in runs) if v is not None})
    return ", ".join(f"{v / 1e6:.2f}M" for v in values) or "not recorded"
