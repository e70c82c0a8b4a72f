"""Attention entropy collapse (Zhai et al. 2023), as a named rule: a run's attention collapsed when, at the end of
training, its mean attention entropy is below COLLAPSE_FRACTION of log T (the entropy of a uniform row over T keys)
while its held-out loss sits at the bigram level (not TRAINED nats below it: the model predicts about as well as
one that reads the previous token alone). That is the slow-convergence form of collapse the paper describes:
sharp attention that does not help, with no divergence.

A run does not vote (Reading.collapsed is None, with why) when it cannot be read this way: it did not finish (a
failed or diverged run has no end of training to read), it logged no finite attention entropy (probes off), its
context length is not recorded, or its data has no bigram level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from andrea_exp.report.effects import References, loss_or_l0, threshold
from andrea_exp.report.run_status import finished
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import seed_vote
from andrea_exp.runs import metric_keys as mk

COLLAPSE_FRACTION = 0.1
RULE = (f"attention collapsed: final mean attention entropy (`{mk.ATTN_ENTROPY}`, the probe's) below "
        f"{COLLAPSE_FRACTION:g} x log T while the held-out loss ends less than {threshold('TRAINED'):g} nats below "
        "the bigram level (Zhai et al. 2023's entropy collapse without divergence)")


@dataclass(frozen=True)
class Reading:
    collapsed: bool | None  # None: not measured
    why: str  # the numbers it rests on, or why it does not vote
    entropy_fraction: float | None = None  # final entropy / log T


def final_entropy(run: Run) -> float | None:
    """The attention entropy at the last probe (the training batch's, attn_step, where no probe ran)."""
    for key in (mk.ATTN_ENTROPY, mk.ATTN_STEP_ENTROPY):
        value = run.last(key)
        if value is not None and math.isfinite(value):
            return value
    return None


def read(run: Run, refs: References) -> Reading:
    """The rule on one run."""
    if not finished(run):
        return Reading(None, f"not measured: the run {run.status}")
    entropy = final_entropy(run)
    if entropy is None:
        return Reading(None, "not measured: no attention entropy logged")
    seq_len = run.config.get("data.seq_len")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 2:
        return Reading(None, "not measured: no context length (data.seq_len)")
    if refs.bigram is None:
        return Reading(None, "not measured: no bigram level for its data")
    loss = loss_or_l0(run)
    if loss is None:
        return Reading(None, "not measured: no held-out loss")
    fraction = entropy / math.log(seq_len)
    sharp = fraction < COLLAPSE_FRACTION
    at_bigram = loss > refs.bigram - threshold("TRAINED")
    why = (f"entropy {entropy:.3g} nats = {fraction:.3g} x log T ({'<' if sharp else '>='} {COLLAPSE_FRACTION:g}), "
           f"loss {loss:.3f} vs bigram {refs.bigram:.3f} ({'at' if at_bigram else 'below'} the bigram level)")
    return Reading(sharp and at_bigram, why, fraction)


def cell_collapsed(runs: list[Run], refs: References) -> bool | None:
    """A cell collapsed when >= 2/3 of the seeds that can be read did (the report's seed vote); None: none can."""
    readings = [r.collapsed for r in (read(run, refs) for run in runs) if r.collapsed is not None]
    return seed_vote(readings) if readings else None
