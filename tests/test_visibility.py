"""One rule says which keys a query sees (model.visibility.key_visible): its hand-computed cases, its users (the
explicit path's mask, the statistics' row layout, the metrics) following it, and the Triton kernels' walk over
key blocks against it: the walk's arithmetic in plain Python on CPU, the kernels' own functions on the GPU."""

from __future__ import annotations

import pytest
import torch

from andrea_exp.instruments import metrics
from andrea_exp.model import stat_rows, step_stats
from andrea_exp.model.attention import future_mask
from andrea_exp.model.visibility import first_kept_row, kept_rows, key_visible, visible_count, visible_keys

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def test_the_rule_by_hand():
    # causal, as many queries as keys: key j visible to query i when j <= i
    assert key_visible(2, 2, 4, 4, True) and key_visible(2, 0, 4, 4, True) and not key_visible(2, 3, 4, 4, True)
    assert key_visible(2, 3, 4, 4, False)  # no mask: every key
    # two queries, the last two of four positions: query 0 stands at position 2
    assert key_visible(0, 2, 2, 4, True) and not key_visible(0, 3, 2, 4, True) and key_visible(1, 3, 2, 4, True)
    assert visible_keys(3, 3, True).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert visible_keys(2, 4, True).tolist() == [[True, True, True, False], [True, True, True, True]]
    assert visible_keys(2, 3, False).tolist() == [[True] * 3] * 2
    assert visible_count(4, 4, True).tolist() == [1, 2, 3, 4] and visible_count(4, 4, False).tolist() == [4] * 4
    assert visible_count(2, 4, True).tolist() == [3, 4]


def test_the_kept_rows_by_hand():
    """Rows with more than one visible key: a causal row 0 sees one key; a single key leaves none."""
    assert first_kept_row(5, 5, True) == 1 and kept_rows(5, True) == 4
    assert first_kept_row(5, 5, False) == 0 and kept_rows(5, False) == 5
    assert first_kept_row(1, 1, True) == 1 and kept_rows(1, True) == 0
    assert first_kept_row(1, 1, False) == 1 and kept_rows(1, False) == 0
    assert first_kept_row(2, 4, True) == 0  # fewer queries than keys: the first sees 3


@pytest.mark.parametrize("causal", [True, False])
def test_every_user_follows_the_one_rule(causal):
    for t_q, t_k in ((1, 1), (2, 2), (5, 5), (3, 7), (64, 64)):
        rule = torch.tensor([[key_visible(i, j, t_q, t_k, causal) for j in range(t_k)] for i in range(t_q)])
        assert torch.equal(visible_keys(t_q, t_k, causal), rule)
        assert torch.equal(metrics.visible_keys(t_q, t_k, causal), rule)
        assert torch.equal(metrics.visible_count(t_q, t_k, causal), rule.sum(-1))
        if causal:  # the explicit and fused paths' mask: what the rule hides
            assert torch.equal(future_mask(t_q, t_k), ~rule)
        first = int((rule.sum(-1) <= 1).sum())
        assert metrics.first_kept_row(t_q, t_k, causal) == first
        if t_q == t_k:
            assert stat_rows.kept_rows(t_q, causal) == t_q - first


@pytest.mark.parametrize("causal", [True, False])
def test_the_statistics_pytorch_path_sees_the_rules_keys(causal):
    """row_softmax_stats over key chunks smaller than T: each row's sum l counts exactly its visible keys when every
    score is 0 (exp 0 = 1 each), and its max m is the largest visible score."""
    T = 7
    q = torch.zeros(1, 1, T, 4)
    _, total, _ = step_stats.row_softmax_stats(q, q, 1.0, causal, key_chunk=3)
    assert torch.equal(total[0, 0], visible_count(T, T, causal).float())
    rising = torch.arange(T, dtype=torch.float32)[:, None].expand(T, 4)[None, None]  # key j's score with q 1: 4 j
    m, _, _ = step_stats.row_softmax_stats(torch.ones(1, 1, T, 4), rising, 1.0, causal, key_chunk=3)
    last_visible = torch.tensor([max(j for j in range(T) if key_visible(i, j, T, T, causal)) for i in range(T)])
    assert torch.equal(m[0, 0], 4.0 * last_visible)


# ---------------------------------------------------------------- the Triton kernels' key blocks


def masked_key_range(block: int, T: int, causal: bool, block_m: int, block_n: int) -> tuple[int, int]:
    """step_stats_kernel._masked_key_range in Python: keys 0..lo-1 unmasked, lo..hi-1 masked."""
    if causal:
        lo = block * block_m
        return lo, min(lo + block_m, T)
    return (T // block_n) * block_n, T


def visible_in_block(rows: torch.Tensor, keys: torch.Tensor, T: int, causal: bool) -> torch.Tensor:
    """step_stats_kernel._visible_in_block in Python."""
    visible = keys[None, :] < T
    if causal:
        visible = visible & (keys[None, :] <= rows[:, None])
    return visible


def walked(T: int, causal: bool, block_m: int, block_n: int) -> torch.Tensor:
    """How often the kernels fold key j into row i, as they walk the key blocks (both loops of _row_block_stats and
    _attn_fwd_stats): (rows padded to the row blocks, keys padded past the last visited block) int."""
    n_blocks = -(-T // block_m)
    seen = torch.zeros(n_blocks * block_m, (-(-T // block_n) + 1) * block_n, dtype=torch.int32)
    for block in range(n_blocks):
        rows = block * block_m + torch.arange(block_m)
        lo, hi = masked_key_range(block, T, causal, block_m, block_n)
        for start in range(0, lo, block_n):  # unmasked: every key of the block counts
            seen[rows[:, None], start + torch.arange(block_n)[None, :]] += 1
        for start in range(lo, hi, block_n):
            keys = start + torch.arange(block_n)
            seen[rows[:, None], keys[None, :]] += visible_in_block(rows, keys, T, causal).int()
    return seen


def assert_walk_is_the_rule(seen: torch.Tensor, T: int, causal: bool, where: str):
    assert torch.equal(seen[:T, :T], visible_keys(T, T, causal).int()), where  # each visible key once, no other
    assert not seen[:T, T:].any(), where  # nothing past the last key (rows past T are padding, never stored)


# the kernels' block sizes: launch_config's bf16 / fp16 (and attn_fwd_stats_kernel's) and float32 ones, and the
# fused forward's other launch configurations (benchmarks/investigations/attn_fwd_stats_configs.py)
BLOCKS = [(64, 64), (64, 32), (128, 128), (128, 64), (128, 32)]
LENGTHS = (1, 2, 17, 31, 32, 33, 63, 64, 65, 127, 128, 200)


@pytest.mark.parametrize("block_m, block_n", BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
def test_the_kernels_key_blocks_visit_the_rules_keys(block_m, block_n, causal):
    for T in LENGTHS:
        assert_walk_is_the_rule(walked(T, causal, block_m, block_n), T, causal, f"T {T}")


def test_the_walk_check_fails_on_a_wrong_walk():
    """Causal blocks of 48 rows and 32 keys: for rows 48..95 the unmasked loop runs over keys 0..63, so keys
    48..63 reach rows that must not see them (and are walked again masked); the check sees it."""
    with pytest.raises(AssertionError):
        assert_walk_is_the_rule(walked(100, True, 48, 32), 100, True, "48 rows, 32 keys")


if triton is not None:
    from andrea_exp.model.step_stats_kernel import _masked_key_range, _visible_count, _visible_in_block

    @triton.jit
    def _walk(seen_ptr, count_ptr, T, n_keys, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """`walked` with the kernels' own functions; count: each row's visible keys as _store_row_partials reads."""
        block = tl.program_id(0)
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        lo, hi = _masked_key_range(block, T, CAUSAL, BLOCK_M, BLOCK_N)
        for start_n in range(0, lo, BLOCK_N):
            ptrs = seen_ptr + offs_m[:, None] * n_keys + (start_n + tl.arange(0, BLOCK_N))[None, :]
            tl.store(ptrs, tl.load(ptrs) + 1)
        for start_n in range(lo, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            ptrs = seen_ptr + offs_m[:, None] * n_keys + offs_n[None, :]
            tl.store(ptrs, tl.load(ptrs) + _visible_in_block(offs_m, offs_n, T, CAUSAL).to(tl.int32))
        tl.store(count_ptr + offs_m, _visible_count(offs_m, T, CAUSAL, BLOCK_M))


@pytest.mark.gpu(triton_interpreter=True)
@pytest.mark.parametrize("block_m, block_n", BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
def test_the_kernels_own_key_ranges_follow_the_rule(block_m, block_n, causal):
    device = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: Triton's interpreter
    for T in LENGTHS:
        n_blocks = triton.cdiv(T, block_m)
        n_keys = (triton.cdiv(T, block_n) + 1) * block_n
        seen = torch.zeros(n_blocks * block_m, n_keys, dtype=torch.int32, device=device)
        count = torch.zeros(n_blocks * block_m, dtype=torch.int32, device=device)
        _walk[(n_blocks,)](seen, count, T, n_keys, CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n)
        assert torch.equal(seen.cpu(), walked(T, causal, block_m, block_n)), f"T {T}"  # the Python walk is theirs
        assert_walk_is_the_rule(seen.cpu(), T, causal, f"T {T}")
        assert torch.equal(count[:T].cpu(), visible_count(T, T, causal).int()), f"T {T}"


def test_the_mask_and_the_counts_are_made_on_the_device_asked_for():
    """A GPU caller gets them on its GPU, with no copy from the host: shown here on PyTorch's meta device (shapes
    and devices, no data), which a CPU machine has too."""
    assert visible_keys(3, 5, True, device="meta").device.type == "meta"
    assert visible_keys(3, 5, True, device="meta").shape == (3, 5)
    assert visible_count(3, 5, False, device="meta").device.type == "meta"
