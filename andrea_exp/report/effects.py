"""Effect sizes with 95% intervals, decided against named thresholds: what every verdict of the first screen
rests on.

An effect is a number per seed (a paired difference where a twin exists: unscaled minus its scaled twin,
same d_k, init, LR and seed), summarised as mean and 95% t interval over seeds. A decision compares the
interval with one threshold: wholly on the claim's side -> "holds", wholly on the other -> "does not hold",
straddling it -> "inconclusive". One seed gives no interval: the value decides and the row says "n=1".

Progress is read on a scale that means the same on every corpus: 0 at the data's bigram level (what a model
whose attention does not work still reaches through its embeddings and MLP), 1 at the reference: the exact
floor where the source knows it, else the held-out loss of the reference runs trained on the same data for
that purpose (config `report_role: reference`; andrea_exp.report.reference), which no statement judges. With
neither, progress is not measured: a judged cell never sets the scale it is judged on.
A run that diverged counts at its step-0 loss; a run that failed for a reason outside training (out of memory,
killed, an error, interrupted) does not vote: the data box names it, and a place that needs it is not measured
and says so (Place.why, the one reason a place does not vote, whatever the cause).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from andrea_exp.report.bestlr import final_loss
from andrea_exp.report.cells import Cell
from andrea_exp.report.reference import matching
from andrea_exp.report.run_status import finished, votes
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import EARLY_WINDOW, paired, seed_vote, window_mean
from andrea_exp.report.stats import Stat, stat
from andrea_exp.runs import metric_keys as mk

HOLDS, FAILS, INCONCLUSIVE, NOT_MEASURED = "holds", "does not hold", "inconclusive", "not measured"
BY_CONSTRUCTION = "by construction at init"  # a step-0 value the initialisation sets: not evidence

# Thresholds, each with why (printed in the report's rules section).
THRESHOLDS = {
    "PEAKED": (0.5, "C3: a row is dominated by one position when its largest probability is at least 0.5 "
                    "(more than all the others together)"),
    "VANISH": (-1.0, "C4: row gradients vanish when the unscaled median ||d loss / d S_i|| is an order of magnitude "
                     "(log10 ratio -1) below its scaled twin's"),
    "STALL": (0.25, "C4: a cell stalls when its progress is below 0.25: it closed less than a quarter of the way "
                    "from the bigram level to the reference"),
    "PROCEED": (0.5, "C5: training proceeds when progress is at least 0.5: half way from the bigram level "
                     "to the reference"),
    "UNIT": (2.0, "C5: near unit scale: the scaled score std within a factor 2 of 1 at init, and within a factor "
                  "2 of the smallest d_k's over training"),
    "LEAK": (0.1, "C7: a shortcut is learned when the as-trained loss is below its causal twin's by at least "
                  "0.1 nats and 3 standard errors"),
    "GROWTH": (0.1, "C2: the sqrt(d_k) law holds when the log-log slope of the unscaled score std over d_k is "
                    "within 0.1 of 0.5"),
    "TRAINED": (0.1, "C7: a causal twin trained when its held-out loss ends at least 0.1 nats below the bigram "
                     "level (its attention did something); a leak against a twin that did not is not measured"),
    "FLAT": (1.0, "C9: the divisor keeps the row gradient flat when it changes by less than a factor 10 "
                  "(|log10| < 1) from the smallest to the largest d_k; without it, it falls when it drops by more"),
}


def threshold(name: str) -> float:
    return THRESHOLDS[name][0]


@dataclass
class Effect:
    """A quantity per seed, its summary, and the decision against one threshold."""

    name: str
    values: dict  # seed -> value
    low: float = -math.inf  # the claim's side is low < value < high
    high: float = math.inf

    @property
    def stat(self) -> Stat:
        return stat(self.values.values())

    @property
    def interval(self) -> tuple[float, float]:
        st = self.stat
        return (st.mean, st.mean) if st.n == 1 else st.interval

    @property
    def why(self) -> str:
        """Why nothing was measured, where the runs behind it failed: 'its twin failed'."""
        return getattr(self.values, "why", "") if not self.stat.n else ""

    @property
    def decision(self) -> str:
        if not self.stat.n:
            return NOT_MEASURED
        lo, hi = self.interval
        if self.low < lo and hi < self.high:
            return HOLDS
        if hi <= self.low or lo >= self.high:
            return FAILS
        return INCONCLUSIVE

    def text(self, digits: int = 3) -> str:
        st = self.stat
        if not st.n:
            return "-"
        g = lambda v: f"{0.0 if abs(v) < 1e-12 else v:.{digits}g}"  # noqa: E731  (rounding residue reads as 0)
        if st.n == 1:
            return f"{g(st.mean)} (n=1)"
        lo, hi = self.interval
        return f"{g(st.mean)} [{g(lo)}, {g(hi)}] (n={st.n})"


@dataclass
class Place:
    """One condition a claim is judged at, with its effect and any effects shown beside it."""

    where: dict  # e.g. {"d_k": 4096, "init": "unit", "lr": 0.003, "phase": "init"}
    effect: Effect
    also: list[Effect] = field(default_factory=list)  # a place holds only if these hold too
    shown: list[Effect] = field(default_factory=list)  # printed beside it, not deciding (a stronger, sufficient test)
    unmeasurable: str = ""  # why the claim cannot be read here (e.g. "neither twin trained"): it does not vote
    by_construction: bool = False  # its premise is the initialisation itself: shown, not counted as evidence

    @property
    def why(self) -> str:
        """Why the place does not vote ("" when it does): runs behind its effects that failed ('its twin
        failed': whatever else is said of them is moot), else the reason its claim module gave."""
        return next((e.why for e in (self.effect, *self.also) if e.why), "") or self.unmeasurable

    @property
    def votes(self) -> bool:
        return not self.why and not self.by_construction

    @property
    def decision(self) -> str:
        if self.why:
            return NOT_MEASURED
        return self.measured_decision

    @property
    def decision_text(self) -> str:
        if self.why:
            return f"{NOT_MEASURED}: {self.why}"
        if self.by_construction:
            return f"{BY_CONSTRUCTION} ({self.measured_decision})"
        return self.decision

    @property
    def measured_decision(self) -> str:
        decisions = [self.effect.decision, *(e.decision for e in self.also)]
        if NOT_MEASURED in decisions:
            return NOT_MEASURED
        if FAILS in decisions:
            return FAILS
        return INCONCLUSIVE if INCONCLUSIVE in decisions else HOLDS

    def label(self) -> str:
        return where_text(self.where)


def where_text(where: dict) -> str:
    return " ".join(f"{k} {fmt(v)}" for k, v in where.items())


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


# ---------------------------------------------------------------- per-run quantities


# a phase of training -> a reader of one logged key: step 0, the mean over steps 1..200 (the probes of the
# early window after step 0), the last probe after step 0
PHASES = {"init": lambda key: lambda run: run.at_step(key, 0),
          "early": lambda key: window_mean(key, (1, EARLY_WINDOW[1])),
          "end": lambda key: lambda run: run.probe_at_end(key)}


def loss_or_l0(run: Run) -> float | None:
    """Final held-out loss; a run that diverged counts at its step-0 loss (cells hold no failed runs)."""
    loss = final_loss(run)
    return loss if loss is not None and math.isfinite(loss) else run.initial_loss()


def mean_of(runs: list[Run], key: str) -> float | None:
    st = stat(run.last(key) for run in runs)
    return st.mean if st.n else None


# ---------------------------------------------------------------- references and progress


@dataclass
class References:
    """The loss levels one experiment is read against."""

    floor: float | None
    unigram: float | None
    bigram: float | None
    log_vocab: float | None
    reference: float | None  # mean held-out loss of the reference runs on this data (None: none trained)
    l0: float | None
    reference_runs: list = field(default_factory=list)

    @property
    def top(self) -> float | None:
        """Progress 1: the floor where known, else the reference runs' loss; None when neither exists."""
        return self.floor if self.floor is not None else self.reference

    @property
    def bottom(self) -> float | None:
        """Progress 0: the bigram level; the step-0 loss for runs that did not record it."""
        return self.bigram if self.bigram is not None else self.l0

    @property
    def top_name(self) -> str:
        return "floor" if self.floor is not None else "reference run" if self.reference is not None else "none"

    @property
    def bottom_name(self) -> str:
        return "bigram" if self.bigram is not None else "l_0"

    def progress(self, loss: float | None) -> float | None:
        if loss is None or self.top is None or self.bottom is None or self.bottom - self.top <= 0:
            return None
        return (self.bottom - loss) / (self.bottom - self.top)


def references(cells: list[Cell], reference_runs: list[Run] = ()) -> References:
    """The levels of one experiment's cells; `reference_runs` (report_role: reference) on the same data set
    progress 1 where no floor is known, those that failed left out (run_status). The judged cells never do."""
    runs = [run for cell in cells for run in cell.runs]
    floor = mean_of(runs, mk.EVAL_FLOOR)
    ref_runs = [r for r in matching(list(reference_runs), runs) if votes(r)]  # split off before cells drop failed runs
    ref = stat(loss_or_l0(r) for r in ref_runs)
    l0 = stat(r.initial_loss() for r in runs)
    return References(floor if floor is not None and math.isfinite(floor) else None,
                      mean_of(runs, mk.DATA_UNIGRAM_XENT), mean_of(runs, mk.DATA_BIGRAM_XENT),
                      mean_of(runs, mk.DATA_LOG_VOCAB), ref.mean if ref.n else None, l0.mean if l0.n else None,
                      ref_runs)


def trains(runs: list[Run], refs: References) -> bool:
    """Whether an LR trains a cell, on the verdicts' scale: >= 2/3 of its seeds finish with progress >= PROCEED
    (half way from the bigram level to the floor or reference run); where progress is not measured (no floor,
    no reference run), ending TRAINED below the bigram level, as C7's twins."""
    below = trained_below_bigram(refs)
    def ok(run: Run) -> bool:
        if not finished(run):
            return False
        if refs.top is None:
            return below(run)
        prog = refs.progress(loss_or_l0(run))
        return prog is not None and prog >= threshold("PROCEED")
    return seed_vote(ok(r) for r in runs)


def trains_rule(refs: References) -> str:
    return (f"progress >= {threshold('PROCEED'):g}" if refs.top is not None
            else f"held-out loss {threshold('TRAINED'):g} below the bigram level (no floor, no reference run)")


def trained_below_bigram(refs: References) -> Callable[[Run], bool]:
    """Whether a run trained: its held-out loss (step-0 loss if it diverged) ends at least TRAINED
    below the bigram level (progress 0)."""
    def trained(run: Run) -> bool:
        loss = loss_or_l0(run)
        return refs.bottom is not None and loss is not None and loss <= refs.bottom - threshold("TRAINED")
    return trained


def progress_of(refs: References) -> Callable[[Run], float | None]:
    return lambda run: refs.progress(loss_or_l0(run))


# ---------------------------------------------------------------- pairing cells


def groups(cells: list[Cell], *axes: str) -> list[list[Cell]]:
    """The cells of one experiment that agree on every axis but `axes`, one list each, in the order first met."""
    found: dict[str, list[Cell]] = {}
    for cell in cells:
        rest = sorted((k, str(v)) for k, v in cell.axes.items() if k not in axes)
        found.setdefault(repr((cell.experiment, rest)), []).append(cell)
    return list(found.values())


def twins(cells: list[Cell], axis: str, a, b) -> list[tuple[dict, Cell, Cell]]:
    """(shared axes, cell with axis=a, cell with axis=b) for cells that differ only in `axis`."""
    out = []
    for group in groups(cells, axis):
        by_value = {str(cell.get(axis)): cell for cell in group}
        if str(a) in by_value and str(b) in by_value:
            rest = {k: v for k, v in group[0].axes.items() if k != axis}
            out.append((rest, by_value[str(a)], by_value[str(b)]))
    return out


# paired_values(a, b, fn_a, fn_b, combine): seed -> combine(a's value, b's value), seeds both ran
paired_values = paired


TINY_GRADIENT = 1e-30  # a row gradient of exactly 0 (underflow) beside a non-zero one counts as this: vanished


def log10_ratio(x: float, y: float) -> float | None:
    """log10(x / y). Both exactly 0: no ratio exists, the seed does not vote (a clamp would read it as 0).
    One of them 0: it vanished, read at TINY_GRADIENT (the sign, not the size, is what decides)."""
    if x < 0 or y < 0 or (x == 0 and y == 0):
        return None
    return math.log10(max(x, TINY_GRADIENT) / max(y, TINY_GRADIENT))
