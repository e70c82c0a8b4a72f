"""The every-step attention statistics' layout, shared by the PyTorch path (step_stats) and the Triton kernel
(step_stats_kernel): which statistics, in what order, and over which query rows the normalised entropy
averages."""

STATS = ("score_max", "entropy", "entropy_norm", "max_prob", "max_prob_max", "saturated_frac")
N_STATS = len(STATS)


def kept_rows(T: int, causal: bool) -> int:
    """Query rows with more than one visible key (those entropy_norm averages over)."""
    return T - 1 if causal else (T if T > 1 else 0)
