"""C8: ANDREA-120M's shapes (12 heads of (T, 64) concatenated to (1024, 768) into W_O) and its size."""

from __future__ import annotations

from andrea_exp.report import figures, static
from andrea_exp.report.claims.common import (
    ClaimResult,
)
from andrea_exp.report.rules import Check
from andrea_exp.report.study import Study
from andrea_exp.report.table import md_table
from andrea_exp.report.verdicts import Cells, Statement, exact_places

PARAMS_TOL = 0.10  # "about 120M": within 10 %
TITLE = "ANDREA-120M: d_model 768, 12 heads of (T, 64) concatenated to (1024, 768) into W_O; about 120M"


def exact_checks(m: dict) -> list[Check]:
    expect = [("d_model 768", m["d_model"] == 768), ("12 heads", m["n_head"] == 12), ("d_k 64", m["d_k"] == 64),
              ("T 1024", m["T"] == 1024), ("each head outputs (1024, 64)", m["head_out_shape"] == (1024, 64)),
              ("heads concatenate to (1024, 768) before W_O", m["concat_shape"] == (1024, 768)),
              ("about 120M parameters", abs(m["params"] / 120e6 - 1) <= PARAMS_TOL)]
    checks = [Check({"part": part}, bool(ok)) for part, ok in expect]
    checks[-1].value, checks[-1].threshold = f"{m['params']:,}", f"120M ± {PARAMS_TOL:.0%}"
    return checks


def statements(c: Cells) -> list[Statement]:
    return [Statement("C8", TITLE, exact_places(exact_checks(static.model_120m_shapes())), None,
                      "exact check of the pipeline", "built-in")]


def claim(study: Study) -> ClaimResult:
    """The evidence: the preset's shapes and parameter count (table and figure)."""
    m = static.model_120m_shapes()
    checks = exact_checks(m)
    parts = m["parts"]
    path = figures.grouped_bars(study.fig("c8_parameters.png"), list(parts),
                                {"parameters (millions)": [(v / 1e6, 0.0) for v in parts.values()]},
                                ylabel="millions", title=f"andrea_120m, vocab {m['vocab_size']}: "
                                                         f"{m['params'] / 1e6:.2f}M parameters")
    rows = [["d_model", m["d_model"]], ["layers", m["n_layer"]], ["heads", m["n_head"]], ["d_k / d_v",
            f"{m['d_k']} / {m['d_v']}"], ["T", m["T"]], ["vocabulary", m["vocab_size"]],
            ["scores per layer", m["scores_shape"]], ["one head's output", m["head_out_shape"]],
            ["concatenated heads (input of W_O)", m["concat_shape"]], ["W_O output", m["w_o_out_shape"]],
            ["logits", m["logits_shape"]], ["parameters", f"{m['params']:,}"]]
    rows += [[f"  {k}", f"{v:,}"] for k, v in parts.items()]
    return ClaimResult(
        "C8", TITLE,
        "conf/model/andrea_120m.yaml built with a 50304-token vocabulary on the meta device; one forward at T=1024 "
        "with the explicit path captured: the scores' shape, the input of W_O (heads concatenated), and the "
        "parameter count (tied embedding/head counted once).",
        f"each shape must match exactly; the parameter count must be within {PARAMS_TOL:.0%} of 120M.",
        checks, tables=[md_table(["quantity", "value"], rows)], figures=[path])
