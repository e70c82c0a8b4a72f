"""README.md's table of metrics and the registry (metric_keys) name the same keys, with the same meanings."""

from __future__ import annotations

import re
from pathlib import Path

from andrea_exp.runs import docs
from andrea_exp.runs.metric_keys import MEANINGS, METRICS, SUMMARY_KEYS

README = Path(__file__).resolve().parent.parent / "README.md"
REGENERATE = "regenerate it with `python -m andrea_exp.runs.docs` and paste it over README.md's section"


def metrics_section(text: str) -> str:
    """From "## Metrics" up to the next "## " heading (or the end)."""
    match = re.search(r"^## Metrics\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    assert match, "README.md has no '## Metrics' section"
    return match.group(0)


def table_keys(section: str) -> list[str]:
    """The first column of every table row, backticks removed; `\\|` inside a cell is not a column break."""
    keys = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 2 and cells[0] not in ("key", "---"):
            keys.append(cells[0].strip("`"))
    return keys


def test_every_registry_key_is_in_the_readme_and_every_readme_key_is_registered():
    keys = table_keys(metrics_section(README.read_text()))
    missing = [m.key for m in METRICS + SUMMARY_KEYS if m.key not in keys]
    unknown = [k for k in keys if k not in MEANINGS]
    assert not missing, f"registry keys missing from README.md's metrics table: {missing}; {REGENERATE}"
    assert not unknown, f"README.md's metrics table names keys the registry does not know: {unknown}"
    assert len(keys) == len(set(keys)), "a key appears twice in README.md's metrics table"


def test_the_readme_section_is_the_generated_one():
    assert metrics_section(README.read_text()).rstrip() == docs.metrics_section().rstrip(), \
        f"README.md's '## Metrics' section differs from the registry's meanings; {REGENERATE}"


def test_the_table_parser_sees_a_dropped_row_and_escaped_pipes():
    section = docs.metrics_section()
    assert table_keys(section) == [m.key for m in METRICS + SUMMARY_KEYS]
    row = next(line for line in section.splitlines() if line.startswith("| `grad/scores_row_p10`"))
    assert "\\|\\|d loss / d S_i\\|\\|" in row  # the norm bars are escaped, or they would split the row
    assert "grad/scores_row_p10" not in table_keys(section.replace(row + "\n", ""))
    assert "attn/made_up" in table_keys(section + "| `attn/made_up` | not a metric |\n")


def test_per_layer_keys_name_their_variant():
    table = docs.markdown_table(METRICS)
    assert "| `attn/entropy` |" in table and "(per layer: `attn/L{l}/entropy`)" in table
    assert "(per layer: `grad/L{l}/scores`)" in table
    assert "per layer" not in next(line for line in table.splitlines() if line.startswith("| `grad/norm`"))
