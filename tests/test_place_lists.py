"""The places a verdict lists read the same in every process: ties in value ("0.0005" and "best 0.0005") are
broken by the text, not by the order of a set, which changes with Python's string hashes."""

from __future__ import annotations

import os
import subprocess
import sys

from andrea_exp.report.effects import Place
from andrea_exp.report.verdicts import compact

SCRIPT = """
from andrea_exp.report.effects import Effect, Place
from andrea_exp.report.verdicts import compact
places = [Place({"lr": lr, "d_k": 64}, effect=None) for lr in ("0.0001", "best 0.0005", "0.0005", "0.06")]
print(compact(places))
"""


def test_tied_values_are_listed_by_their_text_in_number_order():
    places = [Place({"lr": lr, "d_k": 64}, effect=None) for lr in ("0.06", "best 0.0005", "0.0005", "0.0001")]
    assert compact(places) == "lr 0.0001, 0.0005, best 0.0005, 0.06 (d_k 64)"


def test_the_list_is_the_same_whatever_the_string_hashes():
    lines = set()
    for seed in range(8):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
        lines.add(out.stdout.strip())
    assert lines == {"lr 0.0001, 0.0005, best 0.0005, 0.06 (d_k 64)"}
