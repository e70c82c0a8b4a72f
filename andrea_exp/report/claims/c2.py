"""C2: dot products grow like sqrt(d_k), for random vectors (which premise) and the real model at step 0."""

from __future__ import annotations

import math

from andrea_exp.model.attention import scale_factor
from andrea_exp.report import figures, static
from andrea_exp.report.cells import INIT_ONLY, Cell
from andrea_exp.report.claims.common import (
    ClaimResult,
    at_init,
)
from andrea_exp.report.effects import PHASES, Effect, Place, paired_values, threshold
from andrea_exp.report.rules import Check
from andrea_exp.report.runs import Run
from andrea_exp.report.seeds import seed_check
from andrea_exp.report.stats import Stat, stat
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import Cells, Statement, exact_places, is_causal
from andrea_exp.runs import metric_keys as mk

C2_SYNTH_TOL = 0.10  # random vectors: |std / claimed - 1| <= 10 %
C2_MODEL_TOL = 0.25  # a real model's q, k are neither independent nor exactly unit variance: 25 %


def _premise(run: Run) -> str:
    text = f"model at init, qk_init={run.config.get('model.qk_init')}"
    return text + (", qk_layernorm" if run.config.get("model.qk_layernorm") else "")


def raw_dot_std(run: Run) -> float | None:
    """Std of q.k before the divisor, from the step-0 probe's (scaled) score std."""
    value = run.at_step(mk.ATTN_SCORE_STD, 0)
    d_k = run.config.get("model.d_k")
    if value is None or not d_k:
        return None
    return value / scale_factor(run.config.get("model.scale", "sqrt"), d_k)


def seed_values(runs: list[Run], fn) -> dict:
    """seed -> value. Runs of one seed that differ only in scale or mask start from the same weights, so their
    step-0 values are one measurement each, not independent replicates: averaged first."""
    by_seed: dict = {}
    for run in runs:
        value = fn(run)
        if value is not None and math.isfinite(value):
            by_seed.setdefault(run.seed, []).append(value)
    return {s: sum(v) / len(v) for s, v in by_seed.items()}


def per_seed(runs: list[Run], fn) -> Stat:
    return stat(seed_values(runs, fn).values())


def synthetic_checks(premises=(("random, unit-variance components", "unit_variance"),)) -> list[Check]:
    """The claimed std at each d_k against random vectors (C2b's premise: unit-variance components; the
    evidence shows unit-norm vectors beside them, where the numbers are not expected)."""
    checks = []
    for r in static.dot_product_std():
        claimed = static.CLAIMED_DOT_STD[r["d_k"]]
        for premise, key in premises:
            ok = abs(r[key] / claimed - 1) <= C2_SYNTH_TOL
            checks.append(Check({"premise": premise, "d_k": r["d_k"]}, ok, value=f"{r[key]:.4g}",
                                threshold=f"{claimed:g} ± {C2_SYNTH_TOL:.0%}",
                                distance=C2_SYNTH_TOL - abs(r[key] / claimed - 1)))
    return checks


def claim(study: Study) -> ClaimResult:
    """The evidence: random vectors and the model's q.k at step 0 per init (tables and figure)."""
    synth = static.dot_product_std()
    checks = synthetic_checks((("random, unit-variance components", "unit_variance"),
                               ("random, unit-norm", "unit_norm")))
    rows = [[r["d_k"], static.CLAIMED_DOT_STD[r["d_k"]], r["unit_variance"], r["unit_norm"], 1 / math.sqrt(r["d_k"])]
            for r in synth]
    # per experiment: two experiments may hold the same seed's identical initial model, which must not count twice
    model_groups: dict[tuple, list[Run]] = {}
    for cell in study.claim_cells:
        for run in cell.runs:
            if raw_dot_std(run) is not None:
                model_groups.setdefault((_premise(run), cell.experiment, run.config["model.d_k"]), []).append(run)
    model_rows, model_series = [], {}
    for (premise, exp, d_k), runs in sorted(model_groups.items(), key=lambda kv: kv[0]):
        raw, q_std, k_std = (per_seed(runs, fn) for fn in (raw_dot_std, at_init(mk.ATTN_Q_STD), at_init(mk.ATTN_K_STD)))
        rel = {s: v / math.sqrt(d_k) for s, v in seed_values(runs, raw_dot_std).items()}
        check = seed_check({"premise": premise, "experiment": exp, "d_k": d_k}, rel,
                           lambda v: abs(v - 1) <= C2_MODEL_TOL, f"std / sqrt(d_k) within 1 ± {C2_MODEL_TOL:.0%}",
                           lambda m: C2_MODEL_TOL - abs(m - 1), runs)
        checks.append(check)
        model_rows.append([premise, exp, d_k, str(raw), math.sqrt(d_k), str(q_std), str(k_std)])
        model_series.setdefault(f"[{exp}] {premise}", []).append((d_k, raw.mean, raw.std))
    d_ks = sorted({r["d_k"] for r in synth} | {d for _, _, d in model_groups})
    series = {"random, unit-variance": [(r["d_k"], r["unit_variance"], 0.0) for r in synth],
              "random, unit-norm": [(r["d_k"], r["unit_norm"], 0.0) for r in synth], **model_series}
    path = figures.line_panels(study.fig("c2_dot_product_std.png"), [{
        "title": "std of q.k (before the divisor)", "xlabel": "d_k", "ylabel": "std", "series": series,
        "refs": [("sqrt(d_k)", d_ks, [math.sqrt(d) for d in d_ks]),
                 ("1/sqrt(d_k)", d_ks, [1 / math.sqrt(d) for d in d_ks])], "logx": 2, "logy": True}], n_cols=1)
    tables = [md_table(["d_k", "claimed", "std, unit-variance components", "std, unit-norm vectors", "1/sqrt(d_k)"],
                       rows)]
    inits = sorted({str(r.config.get("model.qk_init")) for r in study.claim_runs})
    missing_inits = [q for q in ("unit", "gpt2", "torch") if q not in inits]
    notes = ([f"No runs at qk_init={', '.join(missing_inits)}: run `andrea-exp -m experiment=qk_init`."]
             if missing_inits and inits else [])
    notes += ["The chapter's numbers (8, 16, 64) need vectors whose components have unit variance; for unit-norm "
             "vectors the dot product's std is 1/sqrt(d_k)."]
    if model_rows:
        tables.append(md_table(["premise", "experiment", "d_k", "std of q.k at step 0 (seeds)", "sqrt(d_k)",
                                "q std", "k std"], model_rows))
    else:
        notes.append("No step-0 probe records among the runs read: the real model's q, k are not measured here.")
    return ClaimResult(
        "C2", "Dot products grow like sqrt(d_k): about 8 at d_k=64, 16 at 256, 64 at 4096",
        "std of q.k over 8,000 random pairs per d_k, for Gaussian components of variance 1 and for unit-norm "
        "vectors; and the real model's q.k before the divisor at step 0 (probe `attn/score_std` divided by the "
        "run's scale factor), per q/k initialisation and experiment; n counts seeds (runs of one seed share their "
        "initial q, k and are averaged first).",
        f"a premise passes at a d_k when the measured std is within {C2_SYNTH_TOL:.0%} of the claimed number "
        f"(random vectors) or within {C2_MODEL_TOL:.0%} of sqrt(d_k) (real model, per seed; a place passes when "
        ">= 2/3 of its seeds pass). Premises: random unit-variance and unit-norm vectors; the model at init with "
        "qk_init=unit (q, k components of about unit variance: the claim's premise), gpt2 (std 0.02) and torch "
        "(PyTorch's default), premises where the claim is not expected to hold; the verdict names the premises "
        "where it holds.",
        checks, tables=tables, figures=[path], notes=notes,
        thresholds={"C2_SYNTH_TOL": C2_SYNTH_TOL, "C2_MODEL_TOL": C2_MODEL_TOL})


# ---------------------------------------------------------------- the statements (the verdicts)


def c2_growth(c: Cells) -> Statement:
    """The unscaled score std's log-log slope over d_k, smallest to largest d_k, per seed."""
    places = []
    cells = [x for x in c.training + c.init_only
             if x.get("model.scale") == "none" and (x.kind == INIT_ONLY or is_causal(x))]
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(f"{cell.experiment}|{cell.get('model.qk_init')}", []).append(cell)
    seen = set()
    for group in groups.values():
        group = sorted(group, key=lambda x: float(x.get("model.d_k")))
        lo, hi = group[0], group[-1]
        init = lo.get("model.qk_init")
        if len(group) < 2 or init in seen:
            continue
        seen.add(init)
        span = math.log(float(hi.get("model.d_k")) / float(lo.get("model.d_k")))
        key = mk.ATTN_SCORE_STD
        values = paired_values(hi, lo, PHASES["init"](key), PHASES["init"](key),
                               lambda a, b: math.log(a / b) / span if a > 0 and b > 0 else None)
        # step 0 only: the initialisation sets q, k's scale, so the slope is shown, not counted as evidence
        places.append(Place({"init": init, "d_k": f"{lo.get('model.d_k')}->{hi.get('model.d_k')}"},
                            Effect("slope of log std(q.k) over log d_k at step 0", values,
                                   0.5 - threshold("GROWTH"), 0.5 + threshold("GROWTH")), by_construction=True))
    head = next((p for p in places if p.where["init"] == "unit"), places[0] if places else None)
    return Statement("C2a", "q.k grows like sqrt(d_k) (the law)", places, head,
                     "slope 0.5 (std proportional to sqrt(d_k))")


def magnitudes(c: Cells) -> Statement:
    """C2b: the chapter's numbers on random vectors (no training), each an exact check of the pipeline."""
    return Statement("C2b", "the magnitudes 8 / 16 / 64 at d_k 64 / 256 / 4096", exact_places(synthetic_checks()),
                     None, "unit-variance q, k components (random vectors)", "built-in")


def statements(c: Cells) -> list[Statement]:
    return [c2_growth(c), magnitudes(c)]
