"""Mean, spread and a 95% t interval over seeds, and the order values are shown in."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Student's t, two-sided 95% (the 0.975 quantile), for 1..30 degrees of freedom; beyond, the normal 1.96
# is within 2% (no scipy here: the table is the standard one, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2).
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with df degrees of freedom (df >= 1)."""
    if df < 1:
        raise ValueError(f"t975 needs df >= 1; got {df}")
    return T975[df - 1] if df <= len(T975) else 1.96


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
