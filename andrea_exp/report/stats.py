"""Mean, spread and a 95% t interval over seeds, and the order values are shown in."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import t as student_t


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with df degrees of freedom (df >= 1), exact at every df."""
    if df < 1:
        raise ValueError(f"t975 needs df >= 1; got {df}")
    return float(student_t.ppf(0.975, df))


@dataclass
class Stat:
    mean: float
    std: float
    n: int

    @property
    def half_width(self) -> float:
        """Half-width of the 95% t interval of the mean: t_{0.975, n-1} std / sqrt(n); nan for n < 2."""
        return t975(self.n - 1) * self.std / math.sqrt(self.n) if self.n > 1 else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        return self.mean - self.half_width, self.mean + self.half_width

    def __str__(self) -> str:
        if self.n == 0:
            return "-"
        if self.n == 1:
            return f"{self.mean:.4g} (n=1)"
        lo, hi = self.interval
        return f"{self.mean:.4g} ± {self.std:.2g} (n={self.n}; 95% CI {lo:.3g}..{hi:.3g})"


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
