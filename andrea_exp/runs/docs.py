"""README's "## Metrics" section, written from the registry (metric_keys) so the two cannot drift apart.

    python -m andrea_exp.runs.docs      # prints the section to paste over README.md's
"""

from __future__ import annotations

from andrea_exp.runs.metric_keys import METRICS, SUMMARY_KEYS, Metric

SECTION_TITLE = "## Metrics"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a bare | would end the table cell (e.g. ||d loss / d S_i||)


def markdown_table(metrics: tuple[Metric, ...]) -> str:
    """`| key | meaning |`, one row per registry entry, in registry order; per-layer keys name their variant."""
    rows = ["| key | meaning |", "|---|---|"]
    for m in metrics:
        meaning = m.meaning + (f" (per layer: `{m.key.replace('/', '/L{l}/', 1)}`)" if m.per_layer else "")
        rows.append(f"| `{m.key}` | {_cell(meaning)} |")
    return "\n".join(rows)


def metrics_section() -> str:
    return "\n".join([
        SECTION_TITLE,
        "",
        "Every key below is logged under the same name to W&B and to the run's `metrics.jsonl` (with `step`).",
        "",
        markdown_table(METRICS),
        "",
        "At the end of a run `summary.json` holds the last value of each key above, the resolved config, and:",
        "",
        markdown_table(SUMMARY_KEYS),
        "",
    ])


if __name__ == "__main__":
    print(metrics_section(), end="")
