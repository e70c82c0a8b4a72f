"""The run's results in three lines: status, steps and where the time went; the held-out loss beside its
references; the files. Printed by the training loop while the W&B run is still open, so its console log keeps them.
"""

from __future__ import annotations

import math
from pathlib import Path

from andrea_exp.runs.metric_keys import LOOP_PHASES, RUN_TIME


def _fmt(value, spec=".4f") -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _time_split(summary: dict) -> str:
    """' (steps 14.1 s, probes 1.9 s, ...)': the loop's phases that took time, from run/time/*."""
    parts = [f"{phase} {summary[RUN_TIME[phase]]:.1f} s" for phase in ("steps", *LOOP_PHASES)
             if (summary.get(RUN_TIME[phase]) or 0) >= 0.05]
    return f" ({', '.join(parts)})" if parts else ""


def results_text(summary: dict, run_dir: Path) -> str:
    loss = summary.get("eval/loss_as_trained")
    return "\n".join([
        f"[andrea-exp] {summary['run/status']} after {summary['run/steps']} steps "
        f"in {summary.get('run/wall_s', 0):.1f} s{_time_split(summary)}",
        f"  held-out loss {_fmt(loss)} | floor {_fmt(summary.get('eval/floor'))} | "
        f"log V {_fmt(summary.get('data/log_vocab'))} (uniform guess) | "
        f"generation loss {_fmt(summary.get('eval/loss_generation'))} | gap {_fmt(summary.get('eval/gap'))}",
        f"  files: {run_dir}/metrics.jsonl, summary.json, checkpoints/",
    ])
