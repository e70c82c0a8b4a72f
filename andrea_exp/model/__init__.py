"""The model (conf/model/*): the attention pipeline stage by stage and its fused paths, and the decoder.

Owns: visibility (which keys a query sees: the one rule every mask follows), attention (scale, mask, softmax,
the explicit and fused paths and the table of the layer's paths), decoder (ANDREA: embeddings, blocks,
head; `Andrea`), head_gemms (the explicit path's GEMMs with layout-preserving gradients), chunked_loss
(cross-entropy without the full logits tensor), step_stats (+ step_stats_kernel, Triton on CUDA, and
stat_rows, their shared layout: the training batch's attention statistics, computed inside the attention's
forward; instruments.attn_stats logs them).

May import: config, runs.
"""
