"""`python -m andrea_exp.report SWEEP_DIR... --out DIR` (`andrea-report`): runs on disk -> report.md + figures.

runs.py reads run directories (anything under the given paths with `.hydra/` and a summary or metrics
file); cells.py groups them into experiments and cells (seeds are replicates; only scientific settings,
andrea_exp.config.schema.is_scientific, split runs; reference.py sets aside the reference runs); claims/ holds
C1-C9 (experiments/CLAIMS.md), one module each with its statements (decided by verdicts.py on effects.py's
effect sizes) and their evidence, static.py the parts that need no training; lr.py adds the
learning-rate sensitivity; markdown.py writes DIR/report.md, figures.py DIR/figures/*.png.

May import: config, runs, data, model, instruments.
"""

from pathlib import Path

# nothing heavy here: the figures' worker processes import this package before they draw
REPO_DIR = Path(__file__).resolve().parent.parent.parent
CLAIMS_FILE = REPO_DIR / "experiments" / "CLAIMS.md"  # what each claim says; the report links to it
