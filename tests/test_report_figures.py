"""Figures drawn by worker processes (figures.drawn_in_parallel) are the same files as figures drawn in line."""

from __future__ import annotations

import pytest

from andrea_exp.report import figures

PANELS = [{"title": "a", "xlabel": "d_k", "ylabel": "std", "logx": 2,
           "series": {"scale=sqrt": [(64, 1.0, 0.1), (256, 1.1, 0.0)],
                      "scale=none": [(64, 8.0, 0.5), (256, 16.0, 1.0)]}},
          {"title": "b", "series": {"scale=sqrt": [(1, 2.0, 0.0), (2, 3.0, 0.0)]}}]
BARS = {"as trained": [(0.9, 0.01), (0.03, 0.0)], "at generation": [(0.92, 0.02), (12.0, 0.3)]}


def draw_all(out):
    return [figures.line_panels(out / "lines.png", PANELS),
            figures.grouped_bars(out / "bars.png", ["causal", "unmasked"], BARS, ylabel="nats", title="gap"),
            figures.loss_curve_panels(out / "curves.png", [{"title": "c", "floor": 0.9,
                                                            "curves": {"x": ([0, 10], [3.0, 1.0], [0.1, 0.0])}}],
                                      title="loss")]


def test_figures_drawn_in_parallel_are_the_files_drawn_in_line(tmp_path):
    in_line = draw_all(tmp_path / "line")
    with figures.drawn_in_parallel(workers=2):
        deferred = draw_all(tmp_path / "parallel")
        assert [p.name for p in deferred] == [p.name for p in in_line]  # paths come back before drawing ends
    for a, b in zip(in_line, deferred):
        assert b.read_bytes() == a.read_bytes()
    assert figures._pool is None and not figures._pending


def test_a_figure_that_fails_in_a_worker_raises_when_the_block_ends(tmp_path):
    with pytest.raises(KeyError), figures.drawn_in_parallel(workers=2):
        figures.loss_curve_panels(tmp_path / "bad.png", [{"title": "no curves"}], title="x")
    assert figures._pool is None and not figures._pending
    figures.line_panels(tmp_path / "after.png", PANELS)  # drawn in line again
    assert (tmp_path / "after.png").stat().st_size > 0
