"""The report: LR sensitivity on hand-made numbers, reading runs from disk, and the
whole pipeline on a real tiny CPU sweep (CLI -> run directories -> andrea-report -> report.md)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from andrea_exp.report import static
from andrea_exp.report.__main__ import main as report_main
from andrea_exp.report.cells import TRAINING, group_experiments
from andrea_exp.report.claims.common import run_progress
from andrea_exp.report.lr import lr_curves, lr_sensitivity
from andrea_exp.report.markdown import code_of, machine_of
from andrea_exp.report.runs import Run, load_runs
from andrea_exp.report.stats import stat

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ LR sensitivity (Wortsman et al. 2023)
def test_lr_sensitivity_by_hand():
    # l* = 1.5; terms: min(2, 4) - 1.5 = 0.5, 0, diverged -> l_0 - 1.5 = 2.5; mean = 3.0 / 3
    assert lr_sensitivity({1e-3: 2.0, 1e-2: 1.5, 1e-1: None}, initial_loss=4.0) == pytest.approx(1.0)
    # a loss above l_0 is capped at l_0, and nan counts as diverged: l* = 1; terms 3, 0, 3 -> 2
    assert lr_sensitivity({1: 5.0, 2: 1.0, 3: math.nan}, initial_loss=4.0) == pytest.approx(2.0)
    assert lr_sensitivity({1: 3.0}, initial_loss=4.0) == 0.0
    with pytest.raises(ValueError):
        lr_sensitivity({}, initial_loss=4.0)



def test_stat_mean_and_sample_std_skip_non_finite():
    s = stat([1.0, 2.0, 3.0, math.nan, None, math.inf])
    assert (s.mean, s.std, s.n) == (2.0, 1.0, 3)
    assert stat([]).n == 0 and str(stat([])) == "-"
    assert str(stat([2.5])) == "2.5 (n=1)"


def test_training_progress_by_hand():
    """(l_0 - final) / (l_0 - floor), l_0 the step-0 training loss; 0 when the run did not finish or has no gap."""
    def run(final, floor=1.0, status="finished", l0=3.0):
        summary = {"run/status": status, "eval/loss_as_trained": final, "data/log_vocab": 4.0}
        if floor is not None:
            summary["eval/floor"] = floor
        return Run(Path("r"), {}, summary, [{"step": 0, "train/loss": l0}])

    assert run_progress(run(2.0)) == pytest.approx(0.5)  # (3 - 2) / (3 - 1)
    assert run_progress(run(2.0, floor=None)) == pytest.approx(1 / 3)  # unknown floor counts as 0
    assert run_progress(run(2.0, status="diverged")) == 0.0
    assert run_progress(run(math.nan)) == 0.0
    assert run_progress(run(2.0, floor=3.5)) == 0.0  # l_0 already at or below the floor: nothing to close
    assert run_progress(run(2.0, l0=math.nan)) == pytest.approx((4.0 - 2.0) / 3.0)  # no finite l_0: log V


# ------------------------------------------------------------------ runs on disk
def write_run(run_dir: Path, config: dict, summary: dict, records: list[dict]) -> None:
    """A run directory as the training loop writes it (the contract in DESIGN.md, 'Runs on disk')."""
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("[]\n")
    (run_dir / ".hydra" / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    (run_dir / "summary.json").write_text(json.dumps({**summary, "config": config}))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def base_config(lr: float, seed: int, scale="sqrt") -> dict:
    return {"seed": seed, "name": "hand", "model": {"name": "andrea_tiny", "d_k": 16, "scale": scale, "causal": True},
            "train": {"lr": lr, "max_steps": 10}, "logger": {"mode": "disabled"}}


def test_runs_on_disk_cells_and_lr_sensitivity(tmp_path):
    # 3 LRs x 2 seeds; the largest LR diverges (non-finite loss stored as the string "nan").
    finals = {1e-3: (2.0, 2.2), 1e-2: (1.5, 1.7), 1e-1: (None, None)}
    job = 0
    for lr, per_seed in finals.items():
        for seed, final in enumerate(per_seed):
            status = "finished" if final is not None else "diverged"
            summary = {"run/status": status, "data/log_vocab": math.log(32)}
            records = [{"step": 0, "train/loss": 4.0}]
            if final is None:
                records.append({"step": 5, "train/loss": "nan"})
            else:
                summary["eval/loss_as_trained"] = final
                records.append({"step": 10, "train/loss": final, "eval/loss_as_trained": final})
            write_run(tmp_path / "sweep" / str(job), base_config(lr, seed, scale=True), summary, records)
            job += 1
    runs = load_runs([tmp_path / "sweep"])
    assert len(runs) == 6
    assert all(r.config["model.scale"] == "sqrt" for r in runs)  # true -> sqrt
    diverged = [r for r in runs if r.status == "diverged"][0]
    assert math.isnan(diverged.series("train/loss")[1][-1])
    cells = [cell for e in group_experiments(runs) for cell in e.cells]
    assert [c.label for c in cells] == ["lr=0.001", "lr=0.01", "lr=0.1"]
    assert all(len(c.runs) == 2 for c in cells)
    (curve,) = lr_curves(cells)
    # seed 0: l* = 1.5, terms 0.5, 0, 2.5 -> 1.0; seed 1: l* = 1.7, terms 0.5, 0, 2.3 -> 0.9333
    assert curve.sensitivity.mean == pytest.approx((1.0 + 2.8 / 3) / 2)
    assert curve.sensitivity.n == 2
    assert curve.diverged == 2


def test_launcher_and_bookkeeping_settings_do_not_split_a_cell(tmp_path):
    # one cell run twice: seed 0 packed 12 runs per GPU, seed 1 packed 16, with other logging cadences
    for seed, per_gpu, every in ((0, 12, 100), (1, 16, 250)):
        config = {**base_config(3e-3, seed), "cells_per_gpu": per_gpu, "name": "claims_grid",
                  "probe": {"every": every, "batch_size": 8 * (seed + 1)}}
        config["train"] = {**config["train"], "eval_every": every, "device": f"cuda:{seed}"}
        write_run(tmp_path / f"sweep{seed}" / "0", config, {"run/status": "finished"}, [{"step": 0, "train/loss": 4.0}])
    # and one run that differs in a scientific setting (a longer schedule): another experiment
    other = {**base_config(3e-3, 0), "name": "claims_grid"}
    other["train"] = {**other["train"], "max_steps": 20}
    write_run(tmp_path / "sweep2" / "0", other, {"run/status": "finished"}, [{"step": 0, "train/loss": 4.0}])
    experiments = group_experiments(load_runs([tmp_path]))
    assert len(experiments) == 2
    (pooled,) = [e for e in experiments if len(e.cells[0].runs) == 2]
    assert len(pooled.cells) == 1 and sorted(pooled.cells[0].seeds) == [0, 1]
    assert pooled.setup == {"train.max_steps": 10} and pooled.kind == TRAINING
    assert all(e.label.startswith("claims_grid (max_steps=") for e in experiments)  # one name, told apart


def test_header_states_where_the_machine_comes_from(tmp_path):
    recorded = {"run/status": "finished", "system/gpu": "NVIDIA H200"}
    write_run(tmp_path / "a" / "0", base_config(3e-3, 0), recorded, [{"step": 0, "train/loss": 4.0}])
    write_run(tmp_path / "a" / "1", base_config(3e-3, 1), {"run/status": "finished"}, [{"step": 0, "train/loss": 4.0}])
    runs = load_runs([tmp_path])
    assert machine_of(runs, "NVIDIA H100") == ("NVIDIA H200 (1 runs, recorded in summary.json); NVIDIA H100 "
                                               "(1 runs, given with --machine: these runs do not record it)")
    assert "state it with --machine" in machine_of(runs)
    out = tmp_path / "report"
    report_main([str(tmp_path / "a"), "--out", str(out), "--machine", "NVIDIA H100", "--note", "runs at abc123",
                 "--note", "second line"])
    text = (out / "report.md").read_text()
    assert "- note: runs at abc123\n- note: second line" in text
    assert "| hand | training | - | - | 1 | 2 | 2 in 1 cell (seeds 0, 1) |" in (out / "appendix.md").read_text()


def test_report_rejects_a_missing_directory(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report_main([str(tmp_path / "nope"), "--out", str(tmp_path / "out")])
    assert "SWEEP_DIR must be existing directories" in capsys.readouterr().err


# ------------------------------------------------------------------ claims measured without training
def test_static_claims_by_hand():
    assert static.score_matrix_count(1024, 64)["count"] == 1024 * 1024
    for row in static.dot_product_std(d_ks=(64, 1024), n_pairs=4000):
        assert row["unit_variance"] == pytest.approx(math.sqrt(row["d_k"]), rel=0.06)
        assert row["unit_norm"] == pytest.approx(1 / math.sqrt(row["d_k"]), rel=0.06)
    exact = static.pipeline_checks()
    assert exact["future_mass_max"] == 0.0 and exact["row0_one_hot"] and exact["inf_vs_1e9_max_diff"] == 0.0
    grid = {(r["dtype"], r["magnitude"], r["softmax"]): r for r in static.mask_fill_precision(
        magnitudes=(1.0, 1e10), softmax_in=("fp32",))}
    assert grid[("fp32", 1.0, "fp32")]["max_abs_diff"] == 0.0
    assert grid[("fp32", 1e10, "fp32")]["max_abs_diff"] > 0.5  # real scores far below -1e9: the fill wins mass
    assert "overflow" in grid[("fp16", 1.0, "fp32")]["fill_error"]  # fp16 cannot hold -1e9
    shapes = static.model_120m_shapes()
    assert shapes["concat_shape"] == (1024, 768) and shapes["head_out_shape"] == (1024, 64)
    assert 110e6 < shapes["params"] < 130e6


# ------------------------------------------------------------------ the whole pipeline on a real sweep
@pytest.mark.slow
def test_report_on_a_real_tiny_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "andrea_exp", "-m", "model.d_k=8,32", "model.scale=true,false",
           "model.causal=true,false", "train.max_steps=30", "train.eval_every=15", "probe.every=15",
           "probe.maps_every=30", "logger.mode=disabled", "data.train_sequences=256", "data.eval_sequences=8",
           "data.seq_len=16", "train.batch_size=8", "train.sample_tokens=0", f"hydra.sweep.dir={sweep}"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "andrea_exp.report", str(sweep), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (out / "report.md").read_text()
    appendix = (out / "appendix.md").read_text()
    assert "| 1 in 8 cells (seeds 0) |" in appendix
    assert "8 runs are shorter than 200 steps" in text  # 30-step runs: flagged in the data box
    assert "8 of 8 runs are shorter than 200 steps" in appendix
    assert "## Logit growth and its fixes" in appendix
    # a verdict may carry a flag after it, e.g. "(runs under 200 steps: too short to judge)"
    row = re.compile(r"^\| (C\d[ab]?) \| [^|]+ \| \*\*(.+?)\*\*[^|]* \|", re.M)
    rows = {m.group(1): m.group(2) for m in row.finditer(text)}
    assert set(rows) == {"C1", "C2a", "C2b", "C3", "C4a", "C4b", "C5a", "C5b", "C6", "C7", "C8", "C9"}
    # every scaled/unscaled pair and every unmasked cell is there, so every statement has measured places, but
    # C7's: 30 steps train no causal twin, and a leak against an untrained twin is not measured
    assert {cid for cid, verdict in rows.items() if verdict == "not measured"} <= {"C7"}, rows
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(figures) >= 5 and all((out / f).is_file() for f in figures)
    sections = re.split(r"^## ", appendix, flags=re.M)
    for cid in [f"C{i}" for i in range(1, 10)]:
        (section,) = [s for s in sections if s.startswith(f"{cid}:")]
        # the statements' verdicts, as on the first screen: no second verdict beside them
        said = re.findall(rf"^- ({cid}[ab]?) \(.*?\): \*\*(.+?)\*\*", section, flags=re.M)
        assert said and all(rows[sid] == verdict for sid, verdict in said), (cid, said)
        assert "Per-check rule" not in section
    assert list((out / "attention_maps").rglob("*.png"))


def test_header_states_the_code_the_runs_recorded(tmp_path):
    commit = "a" * 40
    summaries = [{"run/status": "finished", "run/git_commit": commit, "run/git_dirty": False},
                 {"run/status": "finished", "run/git_commit": commit, "run/git_dirty": True, "run/code_sha": "f" * 12},
                 {"run/status": "finished", "run/git_commit": commit, "run/git_dirty": True, "run/code_sha": "f" * 12},
                 {"run/status": "finished", "run/code_sha": "e" * 12},
                 {"run/status": "finished"}]
    for seed, summary in enumerate(summaries):
        write_run(tmp_path / "a" / str(seed), base_config(3e-3, seed), summary, [{"step": 0, "train/loss": 4.0}])
    runs = load_runs([tmp_path])
    assert code_of(runs) == ("aaaaaaa with uncommitted changes, source ffffffffffff (2 runs); "
                             "aaaaaaa (clean) (1 runs); commit not recorded, source eeeeeeeeeeee (1 runs); "
                             "commit not recorded (1 runs)")
    assert code_of([]) == "no runs"
