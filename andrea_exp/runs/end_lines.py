"""The lines a run prints when it ends: its status, the steps this segment ran and where the time went, the
held-out loss beside the references of its data, and its files.

The references are those the report reads: the floor where the data has a known one (the built-in Markov
chain), else the held-out bigram and unigram levels (text and tokens: progress is read from the bigram level).
"""

from __future__ import annotations

import math
from pathlib import Path

from andrea_exp.runs import metric_keys as mk


def number(value, spec: str = ".4f") -> str:
    """A summary value as text; n/a when it is missing or not a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return "n/a"
    return format(value, spec)


def time_split(summary: dict) -> str:
    """' (steps 14.1 s, probes 1.9 s, ...)': the loop's phases that took time, from run/time/*."""
    parts = [f"{phase} {summary[mk.RUN_TIME[phase]]:.1f} s" for phase in ("steps", *mk.LOOP_PHASES)
             if (summary.get(mk.RUN_TIME[phase]) or 0) >= 0.05]
    return f" ({', '.join(parts)})" if parts else ""


def steps_text(summary: dict) -> str:
    """'600 steps', or for a resumed segment '600 steps (273 in this segment, resumed at step 327)'."""
    steps, start = summary.get(mk.RUN_STEPS), summary.get(mk.RUN_START_STEP)
    if isinstance(steps, int) and isinstance(start, int) and start > 0:
        return f"{steps} steps ({steps - start} in this segment, resumed at step {start})"
    return f"{steps} steps"


def references_text(summary: dict) -> str:
    """'floor 0.9308', or where the data has no known floor 'bigram 2.4712 | unigram 3.1904'."""
    floor = summary.get(mk.EVAL_FLOOR)
    if number(floor) != "n/a":
        return f"floor {number(floor)}"
    bigram, unigram = summary.get(mk.DATA_BIGRAM_XENT), summary.get(mk.DATA_UNIGRAM_XENT)
    if number(bigram) == "n/a" and number(unigram) == "n/a":
        return "floor n/a"
    return f"bigram {number(bigram)} | unigram {number(unigram)}"


def end_of_run_lines(summary: dict, run_dir: Path) -> list[str]:
    return [
        f"[andrea-exp] {summary[mk.RUN_STATUS]} after {steps_text(summary)} in "
        f"{summary.get(mk.RUN_WALL_S, 0):.1f} s{time_split(summary)}",
        f"  held-out loss {number(summary.get(mk.EVAL_LOSS_AS_TRAINED))} | {references_text(summary)} | "
        f"log V {number(summary.get(mk.DATA_LOG_VOCAB))} (uniform guess) | "
        f"generation loss {number(summary.get(mk.EVAL_LOSS_GENERATION))} | gap {number(summary.get(mk.EVAL_GAP))}",
        f"  files: {run_dir}/metrics.jsonl, summary.json, checkpoints/",
    ]
