"""The stacked-cells benchmark times the claims grid's own function: its C stacked cells give each cell's
losses and gradients, for SDPA (d_k <= 256) and the bilinear form (above), both masks and both scales."""

import pytest

from benchmarks.investigations.stacked_cells import check_losses


@pytest.mark.parametrize("d_k", [8, 512])
def test_stacked_cells_compute_each_models_loss_and_gradients(d_k):
    diff = check_losses(d_k, smoke=True)
    # float32 rounding: the model's plain loss is computed in float32 even with float64 weights
    assert diff["loss"] < 1e-5 and diff["grad_relative"] < 1e-5, diff
