"""The name of a cell's stability fix, one for every section that reads fixes (growth, fixes): the divisor and
QK-LayerNorm always, then only what the cell adds (soft-capping, sigma-reparam, z-loss), so two fixes never share
a name."""

from __future__ import annotations

from collections.abc import Callable

from andrea_exp.report.cells import LR, Cell


def fix_label(cell: Cell) -> str:
    """'scale=sqrt ln=False', then softcap=C, sigma_reparam, z_loss=Z where the cell sets them."""
    parts = [f"scale={cell.get('model.scale')}", f"ln={bool(cell.get('model.qk_layernorm'))}"]
    if cell.get("model.logit_softcap") is not None:
        parts.append(f"softcap={cell.get('model.logit_softcap'):g}")
    if cell.get("model.sigma_reparam"):
        parts.append("sigma_reparam")
    if cell.get("train.z_loss"):
        parts.append(f"z_loss={cell.get('train.z_loss'):g}")
    return " ".join(parts)


def without_z_loss(fix: str) -> str:
    """The fix's twin without z-loss."""
    return " ".join(part for part in fix.split() if not part.startswith("z_loss="))


def lr_cells(cells: list[Cell], experiment: str, key: Callable[[Cell], tuple]) -> dict[tuple, dict[float, Cell]]:
    """key(cell) -> lr -> cell for `experiment`'s cells (pooled with other experiments or not), sorted by key."""
    out: dict[tuple, dict[float, Cell]] = {}
    for cell in cells:
        if experiment in cell.experiment.split("+") or cell.experiment.startswith(experiment + " "):
            out.setdefault(key(cell), {})[float(cell.get(LR))] = cell
    return dict(sorted(out.items()))
