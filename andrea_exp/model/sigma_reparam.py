"""sigma-reparam (Zhai et al. 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse"):
a weight W used as W_hat = gamma / sigma(W) * W, sigma(W) its largest singular value, gamma a learnable scalar.

The logits q.k are bilinear in W_q and W_k, so bounding their spectral norms by gamma bounds how fast the
attention logits can grow, which is what the paper ties to the collapse of attention entropy. As in the
authors' code: sigma starts from the exact SVD (u its top right singular vector) and gamma at sigma(W) of the
initial weights, so the layer starts as the plain one; each forward in training mode moves u by one step of
power iteration (no gradient) and sigma = v^T W u is differentiated through W only, with u, v held. In eval
mode u stays as it is. The power iteration runs in float32 whatever autocast does.

Registered through torch.nn.utils.parametrize, so every reader of `linear.weight` (the fused q/k/v GEMM,
the head-major path, the bilinear form, the probe's spectral norm) gets W_hat and nothing else changes.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils import parametrize


class SigmaReparam(nn.Module):
    """The parametrization of one (out, in) weight: forward(W) = gamma / sigma(W) * W."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        with torch.no_grad():
            _, s, vh = torch.linalg.svd(weight.detach().float(), full_matrices=False)
        self.register_buffer("u", vh[0].clone())  # (in,): estimate of the top right singular vector
        self.gamma = nn.Parameter(s[0].clone().to(weight.dtype))  # (): the layer's own spectral norm to start

    def sigma(self, weight: torch.Tensor) -> torch.Tensor:
        """sigma(W) by one power-iteration step from u (u updated in training mode); differentiable in W."""
        with torch.autocast(device_type=weight.device.type, enabled=False):
            w = weight.float()
            with torch.no_grad():
                v = F.normalize(w @ self.u, dim=0)  # (out,)
                u = F.normalize(w.t() @ v, dim=0)  # (in,)
                if self.training:
                    self.u.copy_(u)
            return v @ w @ u  # ()

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * (self.gamma / self.sigma(weight)).to(weight.dtype)


def reparametrize(linear: nn.Linear) -> None:
    """linear.weight becomes gamma / sigma(W) * W, W the stored weight (linear.parametrizations.weight.original)."""
    parametrize.register_parametrization(linear, "weight", SigmaReparam(linear.weight))
