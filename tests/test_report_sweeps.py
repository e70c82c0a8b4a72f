"""The report reads the runs it is given, not how they were swept: twins and axes found across sweeps (causal and
unmasked cells from two sweeps with other eval cadences pair up), more runs never turn a measured claim into
"not measured" (an LR scan beside a grid is read as both), and a run that failed for a reason outside training
does not vote while one that diverged does."""

from __future__ import annotations

import contextlib
import random
import tarfile
from pathlib import Path

import pytest
from test_report_effects import SYNTHETIC, cells_of, empty_png, grid_runs, make_run, reference_runs, write_run

from andrea_exp.report import figures, run_status, screen, static, verdicts
from andrea_exp.report.cells import failed_lines, group_experiments
from andrea_exp.report.effects import FAILS, HOLDS, NOT_MEASURED
from andrea_exp.report.markdown import write_report
from andrea_exp.report.runs import Run, load_runs
from andrea_exp.runs import metric_keys as mk

OOM = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def moved(run: Run, sweep: str, **config) -> Run:
    """The same run as another sweep would have left it: its directory under `sweep`, some settings changed."""
    return Run(Path(f"/sweeps/{sweep}/{run.path.name}"), {**run.config, **config}, dict(run.summary), run.records)


def statements(runs: list[Run]) -> dict[str, verdicts.Statement]:
    """Every statement on the runs (reference runs among them set progress 1, judged nowhere)."""
    return {s.id: s for s in screen.statements(cells_of(runs))[0]}


TEXT_TOP = 1.6  # the text grid's reference runs end where its scaled causal cells do: progress 1 there


def places(stmt: verdicts.Statement, drop=()) -> dict:
    """where (less the keys in drop) -> (decision, per-seed values), the places read at a cell's own LR"""
    return {tuple((k, str(v)) for k, v in p.where.items() if k not in drop): (p.decision, dict(p.effect.values))
            for p in stmt.places if not str(p.where.get("lr")).startswith("best")}


# ------------------------------------------------------------------ twins across sweeps
def test_causal_and_unmasked_cells_of_two_sweeps_are_twins(tmp_path):
    """A causal sweep and an unmasked one at another eval cadence (run directories on disk): one experiment with
    the mask as an axis, C7 measured, the same verdict and places as one sweep holding both."""
    runs = grid_runs("text")
    for i, run in enumerate(runs):
        write_run(tmp_path / "one" / "grid" / str(i), moved(run, "grid", **{"train.eval_every": 200}))
        causal = run.config["model.causal"]
        sweep = "causal" if causal else "unmasked"  # each sweep holds model.causal fixed
        write_run(tmp_path / "two" / sweep / str(i), moved(run, sweep, **{"train.eval_every": 200 if causal else 250}))
    one, two = load_runs([tmp_path / "one"]), load_runs([tmp_path / "two"])
    assert {r.sweep.name for r in two} == {"causal", "unmasked"}
    for split in (one, two):
        (experiment,) = group_experiments(split)
        assert experiment.axes == ["model.d_k", "model.scale", "model.causal"]
        assert len(experiment.cells) == 12
    c7_one, c7_two = statements(one)["C7"], statements(two)["C7"]
    assert c7_two.verdict[0] != NOT_MEASURED
    assert c7_two.verdict == c7_one.verdict
    assert places(c7_two) == places(c7_one) and len(c7_two.places) == 6


def test_an_operational_setting_never_splits_and_a_data_setting_never_pairs():
    base = [run for run in grid_runs("text") if run.config["model.causal"]]
    # eval cadence and probe cadence differ between the sweeps: one experiment, no new axis
    runs = [moved(r, f"s{i % 2}", **{"train.eval_every": 100 + i % 2, "probe.every": 10 + i % 3})
            for i, r in enumerate(base)]
    (experiment,) = group_experiments(runs)
    assert experiment.axes == ["model.d_k", "model.scale"]
    # the same cells at another T: two experiments (each read against its own references), never a T axis
    longer = [moved(r, "t128", **{"data.seq_len": 128}) for r in base]
    experiments = group_experiments(base + longer)
    assert len(experiments) == 2 and all(e.axes == ["model.d_k", "model.scale"] for e in experiments)


# ------------------------------------------------------------------ an LR scan beside a grid
def lr_scan(lrs=(1e-4, 3e-4, 1.2e-3, 2.4e-3)) -> list[Run]:
    """The unscaled causal d_k 64 cell at other LRs, 3 seeds, in a sweep of its own: at the smaller two it ends
    below the grid's 1.6 (at 6e-4), at the larger two above."""
    return [make_run(seed, name="claims_120m", d_k=64, scale="none", lr=lr, final=1.5 if lr < 1e-3 else 2.4,
                     probes={0: {mk.ATTN_MAX_PROB: 0.4}}) for lr in lrs for seed in range(3)]


def test_an_lr_scan_beside_a_grid_is_read_as_both():
    grid = [moved(r, "grid", name="claims_120m", **{"train.lr": 6e-4}) for r in grid_runs("text")]
    scan = [moved(r, "scan") for r in lr_scan()]
    top = reference_runs(TEXT_TOP)
    alone, both = statements(grid + top), statements(grid + scan + top)
    (experiment,) = group_experiments(grid + scan)
    assert "train.lr" in experiment.axes
    for cid in ("C3", "C4a", "C4b", "C5a", "C7", "C9"):
        assert alone[cid].verdict[0] != NOT_MEASURED
        assert both[cid].verdict[0] != NOT_MEASURED, cid
        # every place of the grid alone is still there (now named at its LR), with the same seeds' values: progress
        # reads the reference runs, never a judged cell, so the scan's 1.5 at 1e-4 moves no place of the grid
        grid_places, now = places(alone[cid], drop=("lr",)), places(both[cid], drop=("lr",))
        assert grid_places and grid_places.keys() <= now.keys(), cid
        assert all(now[k] == v for k, v in grid_places.items()), cid
    # the LR-conditioned reading: the scanned cell at its best LR (1e-4: a tie with 3e-4 goes to the smaller)
    best = [p for p in both["C4b"].places if str(p.where.get("lr")).startswith("best")]
    assert [(p.where["d_k"], p.where["lr"]) for p in best] == [(64, "best 0.0001")]
    # a cell at one LR has no best LR
    assert all(not str(p.where.get("lr")).startswith("best") for p in alone["C4b"].places)


# ------------------------------------------------------------------ failed is not diverged
@pytest.mark.parametrize("status, votes", [("finished", True), ("diverged", True), ("failed", False),
                                           ("interrupted", False), ("missing", False)])
def test_the_rule_which_runs_vote(status, votes):
    assert run_status.votes(make_run(status=status)) is votes
    assert run_status.finished(make_run(status=status)) is (status == "finished")


@pytest.mark.parametrize("summary, line", [
    ({mk.RUN_STATUS: "failed", mk.RUN_ERROR: OOM, mk.RUN_STEPS: 9}, "failed: OutOfMemoryError at step 9, excluded"),
    ({mk.RUN_STATUS: "failed", mk.RUN_ERROR: "data.path: no such directory: corpora/x", mk.RUN_STEPS: 0},
     "failed: data.path: no such directory: corpora/x at step 0, excluded"),
    ({mk.RUN_STATUS: "interrupted", mk.RUN_STEPS: 120}, "interrupted at step 120 (not resumed), excluded"),
    ({mk.RUN_STATUS: "missing"}, "no summary (killed, or still running), excluded")])
def test_why_a_run_is_excluded_in_one_line(summary, line):
    assert run_status.why_excluded(Run(Path("/s/0"), {}, summary)) == line


def grid_with_scaled_4096(status: str) -> list[Run]:
    """The text grid with its scaled causal d_k 4096 cell replaced: each seed ran out of memory at step 9 (the
    summary the training loop writes for a failed run), or its loss went non-finite at step 40 (diverged)."""
    runs = []
    for run in grid_runs("text"):
        c = run.config
        if (c["model.d_k"], c["model.scale"], c["model.causal"]) == (4096, "sqrt", True):
            if status == "failed":
                summary = {mk.RUN_STATUS: "failed", mk.RUN_ERROR: OOM, mk.RUN_STEPS: 9, mk.TRAIN_LOSS: 4.9}
            else:
                summary = {**{k: v for k, v in run.summary.items() if k.startswith("data/")},
                           mk.RUN_STATUS: "diverged", mk.RUN_ERROR: "non-finite loss at step 40", mk.RUN_STEPS: 40}
            run = Run(run.path, run.config, summary, run.records[:1])
        runs.append(run)
    return runs


def place_at(stmt, **want):
    (found,) = [p for p in stmt.places if all(str(p.where.get(k)) == str(v) for k, v in want.items())]
    return found


def test_a_failed_cell_is_excluded_and_named_and_its_twin_is_not_measured():
    runs = grid_with_scaled_4096("failed")
    stmts = statements(runs + reference_runs(TEXT_TOP))
    # C5b: the scaled cell measured nothing (not "does not proceed"); the other d_k still vote
    c5b = place_at(stmts["C5b"], d_k=4096)
    assert c5b.decision == NOT_MEASURED and c5b.why == "its runs failed"
    assert "not measured at d_k 4096 (lr 0.003 (grid)) (its runs failed)" in stmts["C5b"].verdict[1]
    assert place_at(stmts["C5b"], d_k=64).decision == HOLDS
    # C4b: the unscaled d_k 4096 cell stalls, but the twin it is read against failed
    c4b = place_at(stmts["C4b"], d_k=4096)
    assert c4b.decision == NOT_MEASURED and c4b.why == "its twin failed"
    assert "not measured at d_k 4096 (lr 0.003) (its twin failed)" in stmts["C4b"].verdict[1]
    # C7: a causal twin that failed is one reason, not also "did not train": failed runs say why first
    c7 = place_at(stmts["C7"], d_k=4096, scale="sqrt")
    assert c7.why == "its twin failed" and c7.decision_text == "not measured: its twin failed" and not c7.votes
    assert "not measured at d_k 4096 (scale sqrt) (its twin failed)" in stmts["C7"].verdict[1]
    # the cell keeps its failed runs apart, and the data box names each
    cells = [c for e in group_experiments(runs) for c in e.cells]
    (dead,) = [c for c in cells if c.excluded]
    assert dead.runs == [] and len(dead.excluded) == 3 and dead.label == "d_k=4096 scale=sqrt causal=True"
    c = verdicts.Cells.of(cells)
    _, warnings = screen.data_box(c, cells)
    failed = [w for w in warnings if w.startswith("failed:")]
    assert len(failed) == 3
    assert failed[0].startswith("failed: OutOfMemoryError at step 9, excluded ([claims_grid] d_k=4096 scale=sqrt "
                                "causal=True, seed 0, ")


def test_a_failed_reference_run_never_sets_progress_1():
    """Reference runs are split off before cells keep failed runs apart: the references leave them out too (one
    counted at its step-0 loss, 5.0, would move progress 1 from 1.6 to 2.7)."""
    failed = make_run(2, name="claims_grid_reference", max_steps=3000, status="failed", final=None, role="reference")
    c = cells_of(grid_runs("text") + reference_runs(TEXT_TOP) + [failed])
    assert c.refs["claims_grid"].reference == pytest.approx(TEXT_TOP)
    assert len(c.refs["claims_grid"].reference_runs) == 2


def test_the_written_report_names_the_failed_runs(tmp_path, monkeypatch):
    """On disk, through andrea-report's writer: the data box lines, the verdict's condition, the appendix's cell."""
    if not SYNTHETIC:
        SYNTHETIC.append(static.synthetic_softmax())
    monkeypatch.setattr(static, "synthetic_softmax", lambda: SYNTHETIC[0])
    monkeypatch.setattr(figures, "drawn_in_parallel", contextlib.nullcontext)
    monkeypatch.setattr(figures, "_save", empty_png)
    for i, run in enumerate(grid_with_scaled_4096("failed") + reference_runs(TEXT_TOP)):
        write_run(tmp_path / "sweep" / str(i), run)
    path = write_report([str(tmp_path / "sweep")], tmp_path / "report", ["andrea-report", "sweep"])
    report, appendix = path.read_text(), (tmp_path / "report" / "appendix.md").read_text()
    named = [line for line in report.splitlines() if "failed: OutOfMemoryError at step 9, excluded" in line]
    assert len(named) == 3 and all(line.startswith("- WARNING: failed:") for line in named)
    (c4b,) = [line for line in report.splitlines() if line.startswith("| C4b |")]
    assert "not measured at d_k 4096 (lr 0.003) (its twin failed)" in c4b
    (row,) = [line for line in appendix.splitlines() if "| d_k=4096 scale=sqrt causal=True |" in line]
    assert "| failed 3 |" in row


def test_a_diverged_cell_votes_as_not_proceeding():
    runs = grid_with_scaled_4096("diverged")
    cells = [c for e in group_experiments(runs) for c in e.cells]
    assert not any(c.excluded for c in cells)
    assert not failed_lines(cells)
    stmts = statements(runs + reference_runs(TEXT_TOP))
    # progress at its step-0 loss 5.0: (2.5 - 5.0) / (2.5 - 1.6) per seed, below 0.5
    c5b = place_at(stmts["C5b"], d_k=4096)
    assert c5b.decision == FAILS and c5b.effect.values == {s: pytest.approx(-2.5 / 0.9) for s in range(3)}
    assert "not measured" not in stmts["C5b"].verdict[1]
    # C4b: the unscaled cell (at the bigram level) is not behind a twin that diverged: the place fails
    assert place_at(stmts["C4b"], d_k=4096).decision == FAILS


def test_a_failed_run_run_again_is_not_listed():
    runs = grid_with_scaled_4096("failed")
    again = [moved(r, "rest") for r in grid_runs("text") if r.config["model.d_k"] == 4096 and
             r.config["model.scale"] == "sqrt" and r.config["model.causal"] and r.seed == 0]
    cells = [c for e in group_experiments(runs + again) for c in e.cells]
    (cell,) = [c for c in cells if c.excluded]
    assert [r.seed for r in cell.runs] == [0] and sorted(r.seed for r in cell.excluded) == [1, 2]
    assert len(failed_lines(cells)) == 2


# ------------------------------------------------------------------ the committed runs, any subset
def test_a_run_that_failed_in_every_cell_lists_at_most_five_lines():
    runs = [make_run(seed, d_k=d_k, status="failed") for seed in range(3) for d_k in (64, 256)]
    cells = [c for e in group_experiments(runs) for c in e.cells]
    lines = failed_lines(cells)
    assert len(lines) == 6 and lines[-1] == "1 more failed runs excluded (appendix: Runs and cells)"


@pytest.fixture(scope="module")
def markov_pack(tmp_path_factory) -> dict[str, list[Run]]:
    """The committed Markov-chain runs (experiments/results/h200_runs.tar.xz), by sweep directory."""
    pack = Path(__file__).resolve().parent.parent / "experiments" / "results" / "h200_runs.tar.xz"
    if not pack.is_file():
        pytest.skip(f"no committed run pack at {pack}")
    root = tmp_path_factory.mktemp("pack")
    with tarfile.open(pack) as tar:
        tar.extractall(root, filter="data")
    by_sweep: dict[str, list[Run]] = {}
    for run in load_runs([root]):
        by_sweep.setdefault(run.sweep.name, []).append(run)
    return by_sweep


def measured(stmts: dict) -> set[str]:
    return {cid for cid, s in stmts.items() if s.verdict[0] != NOT_MEASURED}


def test_every_claim_measured_on_a_subset_is_measured_on_the_whole(markov_pack):
    sweeps = sorted(markov_pack)
    lr_scan_runs = markov_pack["lr_sensitivity"] + markov_pack["extras_inv"] + markov_pack["extras_qkln"]
    pairs = [([r for r in lr_scan_runs if r.config["train.lr"] == 2.5e-3], lr_scan_runs)]  # one LR of a scan
    rng = random.Random(0)
    for _ in range(3):  # T: some sweeps; S: about half of T's runs
        whole = [r for name in rng.sample(sweeps, rng.randint(2, len(sweeps))) for r in markov_pack[name]]
        pairs.append((rng.sample(whole, len(whole) // 2), whole))
    for part, whole in pairs:
        on_part, on_whole = measured(statements(part)), measured(statements(whole))
        assert on_part <= on_whole, sorted(on_part - on_whole)
    assert {"C3", "C4a", "C9"} <= measured(statements(pairs[0][0]))


def test_more_seeds_never_flip_a_place_without_moving_its_interval(markov_pack):
    every = [r for runs in markov_pack.values() for r in runs]
    two_seeds, three = statements([r for r in every if r.seed in (0, 1)]), statements(every)
    assert measured(two_seeds) <= measured(three)
    for cid, stmt in two_seeds.items():
        before = {p.label(): p for p in stmt.places}
        for p in three[cid].places:
            q = before.get(p.label())
            if q is not None and {q.decision, p.decision} == {HOLDS, FAILS}:
                assert q.effect.interval != p.effect.interval, (cid, p.label())


def test_the_pack_is_one_data_source(markov_pack):
    assert {r.config.get("data.name") for runs in markov_pack.values() for r in runs} == {"markov"}
    assert sum(map(len, markov_pack.values())) == 312
