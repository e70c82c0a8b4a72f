"""The training loop (conf/train/*) and what surrounds one run in its process: device and precision, the
captured CUDA-graph step, checkpoints, stop requests (a run's, and a local sweep's) and signals, the
progress display, the train/* window, where the wall time went, and facts about the run for its summary.

Owns: loop (`train()`), cell (a run's pieces, built in order), runtime, graphed_step, checkpoint, interrupts,
sweep_stop, signals, progress, logwindow, phases, runfacts.

May import: config, runs, data, model, instruments.
"""
