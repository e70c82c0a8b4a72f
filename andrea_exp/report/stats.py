"""Mean and spread over seeds, and the order values are shown in."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Stat:
    mean: float
    std: float
    n: int

    def __str__(self) -> str:
        if self.n == 0:
            return "-"
        return f"{self.mean:.4g} ± {self.std:.2g} (n={self.n})" if self.n > 1 else f"{self.mean:.4g} (n=1)"


def stat(values) -> Stat:
    """Mean and sample standard deviation of the finite values (n counts them)."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return Stat(math.nan, math.nan, 0)
    mean = sum(finite) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else 0.0
    return Stat(mean, std, n)


def sort_key(value):
    """Numbers in numeric order, then everything else as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))
