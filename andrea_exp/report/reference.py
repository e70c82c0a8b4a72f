"""Reference runs: trained to set progress 1 where the data source knows no floor, never judged.

A run whose config says `report_role: reference` (e.g. the scaled causal d_k 64 cell at its best LR with
more steps) is split off before the runs are grouped into cells: it belongs to no cell, votes on no
statement and appears only in the data box, as the loss that progress 1 stands for on its data.
"""

from __future__ import annotations

from andrea_exp.report.runs import Run

ROLE_KEY = "report_role"
REFERENCE = "reference"
# what a reference run must share with the cells it serves: the same data, read the same way
DATA_KEYS = ("data.name", "data.path", "data.seq_len", "data.vocab_size", "data.order", "data.branching",
             "data.concentration", "data.table_seed")


def is_reference(run: Run) -> bool:
    return str(run.config.get(ROLE_KEY, "judged")) == REFERENCE


def split(runs: list[Run]) -> tuple[list[Run], list[Run]]:
    """(runs that are judged, reference runs)."""
    return [r for r in runs if not is_reference(r)], [r for r in runs if is_reference(r)]


def data_identity(run: Run) -> tuple:
    return tuple(str(run.config.get(key)) for key in DATA_KEYS)


def matching(reference_runs: list[Run], runs: list[Run]) -> list[Run]:
    """The reference runs trained on the same data as `runs`."""
    identities = {data_identity(r) for r in runs}
    return [r for r in reference_runs if data_identity(r) in identities]


def describe(runs: list[Run]) -> str:
    """'d_k 64 sqrt causal, lr 0.003, 3000 steps, 2 runs': what the reference runs are."""
    if not runs:
        return "none"
    parts = []
    for key, label in (("model.d_k", "d_k"), ("model.scale", "scale"), ("train.lr", "lr"),
                       ("train.max_steps", "steps")):
        values = sorted({str(r.config.get(key)) for r in runs})
        parts.append(f"{label} {'/'.join(values)}")
    return ", ".join(parts) + f", {len(runs)} run{'s' if len(runs) != 1 else ''}"
