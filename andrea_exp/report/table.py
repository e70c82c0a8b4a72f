"""Markdown tables: the one format every section of the report uses."""

from __future__ import annotations

import math


def md_table(header: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return "-" if math.isnan(v) else f"{v:.4g}"
        return str(v).replace("|", "\\|")  # a bare | would end the cell
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
