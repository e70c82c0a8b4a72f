"""Runs on disk and in W&B: the run directory's files, the registry of metric names, what a run is called,
the tracking sinks, whether a command may train into a directory, and runs read back as data.

Owns: rundir (metrics.jsonl, summary.json, the W&B id, Hydra's recorded overrides), metric_keys (every logged
key), naming (group, run name, tags), tracking (metrics.jsonl and W&B, one interface), run_guard, code_facts
(the git commit and the source's fingerprint), reader (the one reader of run directories into `Run`s, behind
both frame and the report), frame (runs as a DataFrame; `from andrea_exp import runs; runs.load(...)` and
`andrea-exp-runs` still work), workspace (a W&B workspace for a sweep), docs (README's metrics section from the
registry), timeline (a command's timed spans, written when ANDREA_EXP_TIMELINE names a file; a leaf).

May import: config.
"""

_FRAME_NAMES = ("load", "main", "run_row", "history_rows", "CONFIG_PREFIX", "HISTORY_COLUMNS")


def __getattr__(name):
    """`runs.load(...)` and the `andrea_exp.runs:main` entry point, without importing pandas' side at start-up."""
    if name in _FRAME_NAMES:
        from andrea_exp.runs import frame

        return getattr(frame, name)
    raise AttributeError(f"module 'andrea_exp.runs' has no attribute {name!r}")
