"""Named mutants of the statements' decisions: each one must fail tests/test_report_statements.py or
tests/test_report_effects.py. A quick, targeted complement to tests/mutation.sh (mutmut) for the changes that
would turn a verdict around: inverting a statement, dropping a band or a second requirement, letting a judged
cell set its own reference, clamping a gradient of exactly 0.

    python tests/mutants/statements.py          # every mutant; exit 1 if one survives
    python tests/mutants/statements.py C9-invert

Each mutant runs in a scratch copy of the repository (tracked and untracked files, not the ignored ones)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = ["tests/test_report_statements.py", "tests/test_report_effects.py",
         "--deselect", "tests/test_report_effects.py::test_write_report_first_screen"]
C = "andrea_exp/report/claims/"

# name -> (file, the text as it is, the mutated text)
MUTANTS = {
    "C9-invert": (C + "c9.py", 'drops["none"], high=-threshold("FLAT"))', 'drops["none"], low=-threshold("FLAT"))'),
    "C9-drop-second-requirement": (C + "c9.py", "unscaled, [scaled],", "unscaled, [],"),
    "C4a-invert": (C + "c4.py", 'log10_ratio), high=threshold("VANISH"))',
                   'log10_ratio), low=threshold("VANISH"))'),
    "C5b-invert": (C + "c5.py", 'low=threshold("PROCEED")', 'high=threshold("PROCEED")'),
    "C5a-remove-band": (C + "c5.py", '''Effect("score std / the smallest d_k's", ratio, 1 / threshold("UNIT"),
                                           threshold("UNIT"))''',
                        '''Effect("score std / the smallest d_k's", ratio)'''),
    "C2a-remove-band": (C + "c2.py", '''values,
                                   0.5 - threshold("GROWTH"), 0.5 + threshold("GROWTH"))''', "values)"),
    "best-causal-cell-is-its-own-reference": (
        "andrea_exp/report/effects.py",
        "ref = stat(loss_or_l0(r) for r in ref_runs)",
        "ref = stat(min((stat(loss_or_l0(r) for r in c.runs).mean for c in cells if str(c.get('model.causal')) "
        "== 'True'), default=None) for _ in [0])"),
    "zero-gradients-clamped": ("andrea_exp/report/effects.py", "or (x == 0 and y == 0)", ""),
    "C7-untrained-twin-votes": (C + "c7.py", "unmeasurable=untrained(causal, open_, ref)", "unmeasurable=''"),
    "C3-init-counts": (C + "c3.py", 'by_construction=phase == "init"', "by_construction=False"),
    "holds-where-without-count": ("andrea_exp/report/verdicts.py", 'f"at {len(by[HOLDS])} of {len(measured)} places: ',
                                  'f"'),
}


def run(name: str) -> bool:
    """True when the mutant is killed (a test fails)."""
    path, before, after = MUTANTS[name]
    with tempfile.TemporaryDirectory() as tmp:
        files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                               capture_output=True).stdout.split(b"\0")
        for f in filter(None, files):
            src, dst = REPO / f.decode(), Path(tmp) / f.decode()
            if src.is_file():
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(src.read_bytes())
        target = Path(tmp) / path
        text = target.read_text()
        if text.count(before) != 1:
            raise SystemExit(f"{name}: the text to mutate is not in {path} exactly once")
        target.write_text(text.replace(before, after))
        env = {**os.environ, "PYTHONPATH": tmp, "WANDB_MODE": "disabled"}
        done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider",
                               *TESTS], cwd=tmp, env=env, capture_output=True, text=True)
        return done.returncode != 0


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        print(f"unknown mutant {unknown[0]}; choose from: {', '.join(MUTANTS)}", file=sys.stderr)
        return 2
    survivors = []
    for name in names or MUTANTS:
        killed = run(name)
        print(f"{'killed' if killed else 'SURVIVED'}: {name}", flush=True)
        survivors += [] if killed else [name]
    print(f"SCORE statements: {len(names or MUTANTS) - len(survivors)} / {len(names or MUTANTS)} killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
