"""What is measured on a model (conf/probe/*, train.attn_stats): pure metric functions on tensors, the probe on
a fixed held-out batch, held-out evaluation, attention maps, and the training batch's every-step statistics.

Owns: metrics, probe, evaluate, maps, attn_stats (the every-step statistics' rows and cadence; the statistics
themselves are computed in the forward by model.step_stats).

May import: config, runs, model.
"""
