"""At the chapter's scale: every statement's effect on ANDREA-120M beside the small model's, same tokens.

`python -m andrea_exp.report.scale SWEEPS --out DIR` reads the layout experiments/chapter_scale.sh writes:
SWEEPS/runs* (experiment=claims_120m), SWEEPS/small (claims_grid on the same tokens) and, where present,
SWEEPS/calibrate_steps and SWEEPS/calibrate_lr. It writes DIR/chapter_scale.md. The effects and decisions
are the main report's (andrea_exp.report.verdicts), computed on each model's runs alone; a place of one
model is set beside the other's at the same d_k, scale, phase and comparison, whatever the init and LR
(which differ between the presets and are listed under "conditions that change").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from andrea_exp.report import figures, reference
from andrea_exp.report.cells import group_experiments
from andrea_exp.report.claims import all_statements
from andrea_exp.report.effects import Place
from andrea_exp.report.largest import logit_key as largest_logit_key
from andrea_exp.report.repeats import data_warnings, epochs_text, train_tokens_text
from andrea_exp.report.runs import Run, load_runs
from andrea_exp.report.screen_figures import dks, ref_lines, scaled_and_unscaled
from andrea_exp.report.stats import stat
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import Cells, Statement, is_causal
from andrea_exp.runs import metric_keys as mk

OUT_FILE = "chapter_scale.md"
# settings that may differ between the two presets; each is printed for both
CONDITIONS = ("model.name", "model.n_layer", "model.d_model", "model.n_head", "model.qk_init", "data.seq_len",
              "train.batch_size", "train.max_steps", "train.lr", "train.warmup_steps", "probe.batch_size")
IGNORED_AXES = ("init", "lr")  # differ by design between the presets: not part of a place's identity


def cells_of(runs: list[Run]) -> Cells:
    """The judged runs' cells; reference runs (report_role: reference) only set progress 1 on their data."""
    judged, ref = reference.split(runs)
    return Cells.of([cell for e in group_experiments(judged) for cell in e.cells], ref)


def statements(runs: list[Run]) -> list[Statement]:
    """The statements that rest on runs (the claims' registry; built-in checks are the same for both models)."""
    return all_statements(cells_of(runs), source="runs")


def logit_key(cells: list) -> str:
    """The largest logit, max over heads and layers, at every step where every run logged it, else the probe's
    (report.largest)."""
    return largest_logit_key(run for cell in cells for run in cell.runs)


def figure(models: dict[str, Cells], out: Path) -> Path | None:
    """Per model and d_k, the causal cells with and without the divisor: the largest attention logit (log
    scale) and the training loss against the data's references."""
    panels = []
    for key_of, logy, refs in ((logit_key, True, False), (lambda cells: mk.TRAIN_LOSS, False, True)):
        for model, c in models.items():
            causal = [x for x in c.training if is_causal(x)]
            key = key_of(causal)
            for dk in dks(causal):
                curves = scaled_and_unscaled(causal, dk, key)
                if any(curves.values()):
                    panels.append({"title": f"{model}, d_k {dk}", "ylabel": key, "xlabel": "step", "curves": curves,
                                   "logy": logy, "refs": ref_lines(c.ref(causal[0])) if refs else {}})
    return figures.curve_panels(out / "figures" / "chapter_scale.png", panels, n_cols=5) if panels else None


def place_key(place: Place) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in place.where.items() if k not in IGNORED_AXES))


def place_label(key: tuple) -> str:
    return " ".join(f"{k} {v}" for k, v in key) or "all"


def effect_cell(place: Place | None) -> str:
    """The place's effect and decision; effects that must hold with it follow, each with its own decision."""
    if place is None:
        return "-"
    also = "".join(f"; {e.name} {e.text()}: {e.decision}" for e in place.also)
    return f"{place.effect.text()}: {place.decision}" + (f" (effect {place.effect.decision}{also})" if also else "")


def comparison_rows(large: list[Statement], small: list[Statement]) -> list[list[str]]:
    """One row per place measured on either model, in the large model's order, then the small model's rest."""
    rows = []
    for big, little in zip(large, small):
        by_key_large = {place_key(p): p for p in big.places}
        by_key_small = {place_key(p): p for p in little.places}
        keys = [place_key(p) for p in big.places] + [k for k in by_key_small if k not in by_key_large]
        for key in keys:
            p = by_key_large.get(key) or by_key_small.get(key)
            rows.append([big.id, place_label(key), p.effect.name, effect_cell(by_key_large.get(key)),
                         effect_cell(by_key_small.get(key))])
    return rows


def verdict_rows(large: list[Statement], small: list[Statement]) -> list[list[str]]:
    return [[big.id, big.text, " ".join(big.verdict).strip(), " ".join(little.verdict).strip()]
            for big, little in zip(large, small)]


def shared(runs: list[Run], key: str) -> str:
    values = sorted({str(r.config.get(key)) for r in runs})
    return ", ".join(values)


def conditions_rows(large: list[Run], small: list[Run]) -> list[list[str]]:
    rows = [[key, shared(large, key), shared(small, key)] for key in CONDITIONS]
    rows.append(["model.d_k", shared(large, "model.d_k"), shared(small, "model.d_k")])
    rows.append(["seeds", shared(large, "seed"), shared(small, "seed")])
    rows.append(["parameters (d_k 64)", params(large), params(small)])
    rows.append(["tokens seen", tokens(large), tokens(small)])
    rows.append(["training tokens (data/train_tokens)", train_tokens_text(large), train_tokens_text(small)])
    rows.append(["passes over them (data/epochs)", epochs_text(large), epochs_text(small)])
    for ref in (mk.DATA_UNIGRAM_XENT, mk.DATA_BIGRAM_XENT):
        rows.append([ref, mean_text(large, ref), mean_text(small, ref)])
    return rows


def code_shas(runs: list[Run]) -> str:
    return ", ".join(sorted({str(r.summary.get(mk.RUN_CODE_SHA)) for r in runs}))


def mean_text(runs: list[Run], key: str, digits: int = 4) -> str:
    st = stat(r.last(key) for r in runs)
    return "-" if not st.n else f"{st.mean:.{digits}g}"


def params(runs: list[Run]) -> str:
    values = {r.summary.get(mk.MODEL_PARAMS) for r in runs if str(r.config.get("model.d_k")) == "64"}
    values = [v for v in values if isinstance(v, (int, float))]
    return f"{max(values) / 1e6:.1f}M" if values else "-"


def tokens(runs: list[Run]) -> str:
    cfg = runs[0].config
    n = cfg.get("train.max_steps", 0) * cfg.get("train.batch_size", 0) * cfg.get("data.seq_len", 0)
    return f"{n / 1e6:.1f}M"


def cost_rows(runs: list[Run]) -> list[list]:
    """Per cell (d_k, scale, mask): tokens/s of the step loop, and where each run's wall time went."""
    cells: dict[tuple, list[Run]] = {}
    for r in runs:
        cells.setdefault(tuple(r.config.get(k) for k in ("model.d_k", "model.scale", "model.causal")), []).append(r)
    rows = []
    for key, group in sorted(cells.items(), key=lambda kv: [str(v) for v in kv[0]]):
        rate = stat(steady_tokens_per_s(r) for r in group)
        per_step = (group[0].config.get("train.batch_size") or 0) * (group[0].config.get("data.seq_len") or 0)
        whole = stat(run_seconds(r) for r in group)
        rows.append([*key, len(group), f"{rate.mean:,.0f}" if rate.n else "-",
                     f"{1000 * per_step / rate.mean:.1f}" if rate.n and rate.mean > 0 else "-",
                     mean_text(group, mk.RUN_TIME["evals"], 3), mean_text(group, mk.RUN_TIME["probes"], 3),
                     f"{whole.mean:.1f}" if whole.n else "-"])
    return rows


def steady_tokens_per_s(run: Run) -> float | None:
    """The median of the logged train/tokens_per_s after the first logging window (CUDA-graph capture and
    warm-up fall in that one)."""
    _, values = run.series(mk.TRAIN_TOKENS_PER_S)
    values = sorted(values[1:])
    return values[len(values) // 2] if values else None


def run_seconds(run: Run) -> float:
    """A run's set-up, loop and end (final evaluation, checkpoint and sample), process start aside."""
    return sum(run.last(mk.RUN_TIME[p]) or 0.0 for p in ("setup", "end")) + (run.last(mk.RUN_WALL_S) or 0.0)


def total_wall(runs: list[Run]) -> float:
    return sum(run_seconds(r) for r in runs)


def lr_rows(runs: list[Run]) -> list[list]:
    rows = []
    for r in sorted(runs, key=lambda r: float(r.config.get("train.lr"))):
        steps, values = r.series(mk.EVAL_LOSS_AS_TRAINED)
        rows.append([f"{float(r.config.get('train.lr')):.2g}", r.config.get("train.max_steps"),
                     " / ".join(f"{v:.3f}" for v in values), f"{values[-1]:.4f}" if values else "-"])
    return rows


COST_HEADER = ["d_k", "scale", "causal", "runs", "tokens/s", "ms/step", "evals s", "probes s", "run s"]


def render(large: list[Run], small: list[Run], steps: list[Run] = (), lrs: list[Run] = (),
           machine: str | None = None, figure_path: Path | None = None, references: list[Run] = ()) -> str:
    """chapter_scale.md's text: ANDREA-120M's runs (large) beside the small model's, and the calibration runs.
    `references`: report_role=reference runs; each model reads progress 1 from those on its data."""
    ref_large, ref_small = reference.matching(list(references), large), reference.matching(list(references), small)
    big, little = statements(large + ref_large), statements(small + ref_small)
    finished = sum(r.status == "finished" for r in large)
    lines = [
        "# At the chapter's scale: ANDREA-120M beside the small model, on the same tokens",
        "",
        f"{len(large)} runs of ANDREA-120M ({finished} finished) and {len(small)} of the small model"
        + (f" on {machine}" if machine else "") + f", code {code_shas(large + small)}. Effects and "
        "decisions as in report.md (mean [95% t interval] over seeds, against the same thresholds); with 2 "
        "seeds the interval is the mean +- 12.7 standard errors, so only large or steady effects decide.",
        "",
        "## Conditions that change",
        "",
        md_table(["setting", "ANDREA-120M", "small"], conditions_rows(large, small)),
        "",
        *[line for w in data_warnings(large + small) for line in (f"- WARNING: {w}", "")],
        "## Verdicts",
        "",
        f"Progress 1 (C4b, C5b): reference runs on the model's data, judged nowhere: ANDREA-120M "
        f"{reference.describe(ref_large)}, small {reference.describe(ref_small)}; the data (Shakespeare) has no "
        "known floor, so without a reference run progress is not measured. Spans are the places' d_k "
        "(C9: smallest->largest d_k of each model).",
        "",
        md_table(["statement", "", "ANDREA-120M", "small"], verdict_rows(big, little)),
        "",
        "## Effects, place by place",
        "",
        md_table(["statement", "place", "effect", "ANDREA-120M", "small"], comparison_rows(big, little)),
        "",
    ]
    if figure_path is not None:
        lines += [f"![largest logit and training loss vs step, causal cells]({figure_path.as_posix()})", "",
                  f"Largest attention logit ({logit_key(cells_of(large).training)} for ANDREA-120M, "
                  f"{logit_key(cells_of(small).training)} for the small model; log scale) and training loss "
                  "against the unigram and bigram levels, causal cells, mean and one std over seeds.", ""]
    lines += [
        "## Cost on one GPU",
        "",
        f"ANDREA-120M runs one after another: {total_wall(large):.0f} s of runs in all (set-up, loop and the "
        "final evaluation and checkpoint of each; process start aside). tokens/s: the median logging window "
        "after the first. Unmasked cells score their generation loss on train.generation_sequences windows at "
        "each evaluation (`evals s`).",
        "",
        md_table(COST_HEADER, cost_rows(large)),
    ]
    if steps:
        lines += ["", "### Step time by d_k (40-step runs)", "", md_table(COST_HEADER, cost_rows(list(steps)))]
    if lrs:
        lines += ["", "### LR scan (scaled, causal, d_k 64)", "",
                  md_table(["lr", "steps", "held-out loss at each evaluation", "final"], lr_rows(list(lrs)))]
    return "\n".join(lines) + "\n"


def write(sweeps: Path, out: Path, machine: str | None = None) -> Path:
    """Read experiments/chapter_scale.sh's layout under `sweeps` and write out/chapter_scale.md."""
    large = load_runs(sorted(p for p in sweeps.glob("runs*") if p.is_dir()))
    small = load_runs([sweeps / "small"]) if (sweeps / "small").is_dir() else []
    # reference runs (the `reference` stage) serve whichever model shares their data (T tells them apart)
    refs = load_runs(sorted(p for p in sweeps.glob("reference*") if p.is_dir()))
    if not large or not small:
        raise SystemExit(f"andrea-report: {sweeps} needs runs*/ (experiment=claims_120m) and small/ (claims_grid)")
    optional = [load_runs([sweeps / name]) if (sweeps / name).is_dir() else []
                for name in ("calibrate_steps", "calibrate_lr")]

    out.mkdir(parents=True, exist_ok=True)
    drawn = figure({"ANDREA-120M": cells_of(large), "small": cells_of(small)}, out)
    path = out / OUT_FILE
    path.write_text(render(large, small, *optional, machine=machine, references=refs,
                           figure_path=drawn.relative_to(out) if drawn else None))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m andrea_exp.report.scale", description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", type=Path, help="experiments/chapter_scale.sh's SWEEPS directory")
    parser.add_argument("--out", type=Path, required=True, help="directory for chapter_scale.md")
    parser.add_argument("--machine", help="the machine the runs ran on, for the header")
    args = parser.parse_args(argv)
    if not args.sweeps.is_dir():
        parser.error(f"SWEEPS must be a directory; not found: {args.sweeps}")
    print(f"[andrea-report] wrote {write(args.sweeps, args.out, args.machine)}")


if __name__ == "__main__":
    main(sys.argv[1:])
