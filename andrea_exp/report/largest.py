"""Which logged key the report reads as "the largest attention logit": the true maximum over heads and layers
where the runs logged one (the training batch's attn_step/score_max at every step, else the probe's
attn/score_max_max), else the probe's attn/score_max, a mean over heads and layers of each head's largest logit,
named as such wherever it is shown."""

from __future__ import annotations

from andrea_exp.runs import metric_keys as mk

TRUE_MAXIMA = (mk.ATTN_STEP_SCORE_MAX, mk.ATTN_SCORE_MAX_MAX)  # in order of preference


def logit_key(runs) -> str:
    """The first true-maximum key every run logged, else attn/score_max."""
    runs = list(runs)
    for key in TRUE_MAXIMA:
        if runs and all(run.series(key)[0] for run in runs):
            return key
    return mk.ATTN_SCORE_MAX


def logit_label(key: str) -> str:
    """What the key's value is, in words, for a caption or a column."""
    if key in TRUE_MAXIMA:
        return f"largest attention logit, max over heads and layers (`{key}`)"
    return f"mean over heads and layers of each head's largest attention logit (`{key}`: no true maximum logged)"
