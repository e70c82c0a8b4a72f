"""The study: every run read, its experiments and cells, where figures go, and which cells vote on the claims."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from omegaconf import OmegaConf

from andrea_exp.config.schema import CONF_DIR
from andrea_exp.report import static
from andrea_exp.report.cells import INIT_ONLY, LR, LR_SWEEP, TRAINING, Cell, Experiment
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import distinct_cells


def default_lr() -> float | None:
    """train.lr of conf/train/default.yaml: an LR sweep's cells at this LR may vote on the claims."""
    path = CONF_DIR / "train" / "default.yaml"
    return float(OmegaConf.load(path).lr) if path.exists() else None


@dataclass
class Study:
    runs: list[Run]
    experiments: list[Experiment]
    out: Path  # report directory; figures go to out/figures

    def fig(self, name: str) -> Path:
        return self.out / "figures" / name

    @property
    def cells(self) -> list[Cell]:
        return [cell for e in self.experiments for cell in e.cells]

    @cached_property
    def claim_cells(self) -> list[Cell]:
        """Cells that vote on the claims: training and init-only experiments, and an LR sweep's cells only at
        the default LR (the other LRs belong to the LR-sensitivity section), each distinct run once
        (seeds.distinct_cells). Read once: every claim asks."""
        lr = default_lr()
        return distinct_cells([c for c in self.cells if c.kind in (TRAINING, INIT_ONLY) or
                               (c.kind == LR_SWEEP and lr is not None and math.isclose(float(c.get(LR)), lr))])

    @cached_property
    def lr_cells(self) -> list[Cell]:
        """Every cell of the experiments that sweep train.lr, each distinct run once."""
        return distinct_cells([c for c in self.cells if c.kind == LR_SWEEP])

    @property
    def claim_runs(self) -> list[Run]:
        return [run for cell in self.claim_cells for run in cell.runs]

    @cached_property
    def synthetic(self) -> list[dict]:
        """Random q, k through the pipeline, scaled and unscaled (static.synthetic_softmax): C3, C4, C9 share it."""
        return static.synthetic_softmax()
