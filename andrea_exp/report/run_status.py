"""Which runs vote: the one rule, read wherever the report counts a run.

A run that finished is a result, and so is one that diverged (a non-finite loss, or a loss that ran away: the
training loop's divergence watch): it votes as not proceeding, counted at its step-0 loss. A run that stopped for
a reason outside training (out of memory, killed, a data or library error, interrupted and not resumed, no
summary at all) measured nothing about the claims: it does not vote, and the report names it.
"""

from __future__ import annotations

from andrea_exp.runs import metric_keys as mk
from andrea_exp.runs.reader import Run

FINISHED, DIVERGED = "finished", "diverged"
VOTING = (FINISHED, DIVERGED)


def votes(run: Run) -> bool:
    """A result: the run finished or diverged."""
    return run.status in VOTING


def finished(run: Run) -> bool:
    """Its final evaluation is read; a voting run that did not finish (diverged) counts at its step-0 loss."""
    return run.status == FINISHED


def why_excluded(run: Run) -> str:
    """One line: 'failed: OutOfMemoryError at step 9, excluded' (the error's type where it names one)."""
    if run.status == "missing":
        return "no summary (killed, or still running), excluded"
    steps = run.summary.get(mk.RUN_STEPS)
    at = f" at step {steps}" if isinstance(steps, int) and not isinstance(steps, bool) else ""
    error = str(run.summary.get(mk.RUN_ERROR) or "").strip()
    name = error.split(":", 1)[0].strip()
    what = name if name.isidentifier() else error[:80]
    head = f"{run.status}: {what}" if what else run.status
    return f"{head}{at}{' (not resumed)' if run.status == 'interrupted' else ''}, excluded"
