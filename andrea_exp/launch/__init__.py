"""Starting runs (conf/hydra/*): the console entry point (the Hydra app), the sweep's callback and its table,
one GPU per parallel cell, a private CUDA MPS daemon, and workers that end when their launcher has gone.

Owns: startup (what a Ctrl-C does while the command starts), cli (`andrea-exp`, `python -m andrea_exp`),
sweep (SweepSummary), devices, mps (MpsCallback), orphans.

May import: config, runs, training.
"""
