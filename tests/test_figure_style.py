"""One look across the report's and the appendix's figures: a setting has one colour everywhere, and a log
axis labels its minor ticks in the size of its major ones."""

from __future__ import annotations

import pytest

from andrea_exp.report import figures


def test_a_setting_has_the_same_colour_in_the_report_and_the_appendix():
    report = figures._colours(["1/sqrt(d_k)", "no divisor"])  # the report's curve labels
    appendix = figures._colours(["[grid] scale=sqrt causal=True (n=3)", "[grid] scale=none causal=True (n=3)"])
    assert list(report.values()) == list(appendix.values()) == ["C0", "C3"]
    assert figures._colours(["[x] scale=sqrt qk_layernorm=True (n=1)"]) == {
        "[x] scale=sqrt qk_layernorm=True (n=1)": figures.SETTING_COLOURS["1/sqrt(d_k) + QK-LN"]}


def test_labels_of_one_setting_or_of_none_still_get_distinct_colours():
    labels = ["scale=sqrt causal=True", "scale=sqrt causal=False", "no divisor", "lr=0.001"]
    colours = figures._colours(labels)
    assert colours["no divisor"] == "C3"
    assert len(set(colours.values())) == len(labels)  # the two sqrt labels share the setting, so not its colour


@pytest.mark.parametrize("draw", ["line_panels", "loss_curve_panels", "curve_panels"])
def test_minor_and_major_tick_labels_have_one_size(tmp_path, monkeypatch, draw):
    drawn = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: drawn.append(fig) or path)
    xs, ys = [1, 3, 10, 30, 100], [0.5, 0.9, 2.0, 3.5, 7.0]
    if draw == "line_panels":
        figures.line_panels(tmp_path / "f.png", [{"series": {"a": [(x, y, 0.0) for x, y in zip(xs, ys)]},
                                                  "logx": 10, "logy": True}])
    elif draw == "loss_curve_panels":
        figures.loss_curve_panels(tmp_path / "f.png", [{"title": "t", "curves": {"a": (xs, ys, [0.0] * 5)}}],
                                  title="t")
        drawn[0].axes[0].set_yscale("log")  # its axes are linear; the sizes must hold for a log axis too
    else:
        figures.curve_panels(tmp_path / "f.png", [{"title": "t", "curves": {"a": [(x, y, 0.0) for x, y in
                                                                                         zip(xs, ys)]},
                                                          "logx": 10, "logy": True}])
    (fig,) = drawn
    fig.canvas.draw()
    ax = fig.axes[0]
    sizes = {label.get_fontsize() for axis in (ax.xaxis, ax.yaxis) for label in axis.get_ticklabels(which="both")
             if label.get_text()}
    assert sizes == {figures.TICK_LABEL_SIZE}
