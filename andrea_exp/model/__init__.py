"""The model (conf/model/*): the attention pipeline stage by stage and its fused paths, and the decoder.

Owns: attention (scale, mask, softmax, the explicit and fused paths), decoder (ANDREA: embeddings, blocks,
head; `Andrea`), head_gemms (the explicit path's GEMMs with layout-preserving gradients), chunked_loss
(cross-entropy without the full logits tensor).

May import: config, runs.
"""
