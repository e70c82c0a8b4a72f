"""End of a sweep: one table of every cell (overrides, status, final loss, gap, entropy)."""

from __future__ import annotations

import json
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

_failed: list[str] = []


def failed_cells() -> list[str]:
    """Cells of the last sweep in this process that failed (diverged cells are results, not failures)."""
    return list(_failed)


def read_cells(sweep_dir: Path) -> list[dict]:
    cells = []
    for job_dir in sorted((p for p in Path(sweep_dir).iterdir() if (p / ".hydra").is_dir()),
                          key=lambda p: (len(p.name), p.name)):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        overrides = [line[2:].strip() for line in overrides_file.read_text().splitlines() if line.startswith("- ")]
        summary_file = job_dir / "summary.json"
        summary = json.loads(summary_file.read_text()) if summary_file.exists() else {"run/status": "missing"}
        cells.append({"dir": job_dir, "overrides": " ".join(overrides), "summary": summary})
    return cells


def _num(summary: dict, key: str) -> str:
    value = summary.get(key)
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


def format_table(cells: list[dict]) -> str:
    header = ("cell", "overrides", "status", "final loss", "gap", "entropy")
    rows = [header]
    for cell in cells:
        s = cell["summary"]
        rows.append((cell["dir"].name, cell["overrides"] or "(defaults)", s.get("run/status", "?"),
                     _num(s, "eval/loss_as_trained"), _num(s, "eval/gap"), _num(s, "attn/entropy")))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in rows]
    errors = [f"  cell {c['dir'].name}: {c['summary']['run/error']}" for c in cells
              if c["summary"].get("run/status") in ("failed", "missing") and c["summary"].get("run/error")]
    return "\n".join(lines + (["errors:", *errors] if errors else []))


class SweepSummary(Callback):
    """Prints the table of every cell when a multirun ends and remembers whether any cell failed."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        cells = read_cells(Path(config.hydra.sweep.dir))
        _failed.clear()
        _failed.extend(c["dir"].name for c in cells if c["summary"].get("run/status") in ("failed", "missing"))
        print(f"\n[andrea-exp] sweep {config.hydra.sweep.dir}: {len(cells)} cells, {len(_failed)} failed")
        print(format_table(cells))
