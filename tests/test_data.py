"""Data sources: the Markov chain and its exact floor, determinism, batching, the text loader, decoded samples,
and the one-line errors for a bad data.path."""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import compose_config, data_error_line, data_settings

import andrea_exp.config.data_checks as checks_module
from andrea_exp.config.data_checks import check_data
from andrea_exp.config.validation import ConfigError, validate
from andrea_exp.data.sources import Dataset, MarkovSource, Split, build_dataset, floor_standard_error
from andrea_exp.instruments.evaluate import evaluate


def markov_cfg(**changes):
    """The shipped chain (order 2, branching 4, concentration 0.5, 64 held-out sequences) at a test's size."""
    return data_settings("markov", **{"seq_len": 32, "vocab_size": 16, "train_sequences": 256, **changes})


def floor_by_hand(source: MarkovSource, tokens: torch.Tensor) -> float:
    """Mean true NLL of every target, looked up in the successor lists one token at a time.

    Shares nothing with the module's vectorised lookup: the first `order` tokens of a sequence are
    uniform (NLL log V); after that, the context is the previous `order` tokens read as a base-V number.
    """
    V, k = source.vocab_size, source.order
    total, count = 0.0, 0
    for row in tokens.tolist():
        for t in range(1, len(row)):  # targets are positions 1 .. T
            if t < k:
                total += math.log(V)
            else:
                ctx = 0
                for tok in row[t - k : t]:
                    ctx = ctx * V + tok
                successors = list(source.successors[ctx])
                assert row[t] in successors, "a token the table cannot produce"
                total += -math.log(source.probs[ctx][successors.index(row[t])])
            count += 1
    return total / count


def test_floor_is_the_mean_true_nll_of_the_held_out_split():
    data = build_dataset(markov_cfg(), seq_len=32, seed=0)
    held = data.eval.tokens
    assert held.shape == (64, 33)
    assert data.floor == pytest.approx(floor_by_hand(data.source, held), rel=1e-12)
    # the module's own per-token lookups agree with the NLL recorded while sampling
    torch.testing.assert_close(data.source.nll_of(held), data.eval.true_nll, rtol=1e-12, atol=1e-12)
    assert data.floor == pytest.approx(data.eval.true_nll.mean().item(), rel=1e-12)
    # sanity of scale: above 0, below the uniform guess
    assert 0 < data.floor < math.log(16)


def test_default_config_floor_by_hand():
    cfg = compose_config("data.train_sequences=64")
    data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed)
    assert data.floor == pytest.approx(floor_by_hand(data.source, data.eval.tokens), rel=1e-12)


@pytest.mark.parametrize("vocab_size,branching", [(16, 4), (6, 5), (4, 9)])
def test_transition_table_rows_are_distributions(vocab_size, branching):
    source = MarkovSource(vocab_size=vocab_size, order=2, branching=branching, concentration=0.5, table_seed=3)
    width = min(branching, vocab_size)
    assert source.probs.shape == source.successors.shape == (vocab_size ** 2, width)
    np.testing.assert_allclose(source.probs.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(source.probs > 0)
    # each context has `branching` distinct successors; the dense table rebuilt from them sums to 1
    dense = np.zeros((vocab_size ** 2, vocab_size))
    for ctx in range(vocab_size ** 2):
        assert len(set(source.successors[ctx].tolist())) == width
        dense[ctx, source.successors[ctx]] = source.probs[ctx]
    np.testing.assert_allclose(dense.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # nll_of scores a forbidden transition as infinitely unlikely
    forbidden = next(t for t in range(vocab_size) if t not in source.successors[0]) if width < vocab_size else None
    if forbidden is not None:
        nll = source.nll_of(torch.tensor([[0, 0, forbidden]]))
        assert nll[0, 1] == math.inf


def test_samples_follow_the_table():
    """Empirical successor frequencies match the table (order 1, 8 tokens, 100k transitions)."""
    source = MarkovSource(vocab_size=8, order=1, branching=3, concentration=1.0, table_seed=1)
    tokens = source.sample(2000, 50, seed=4).tokens.numpy()  # (2000, 51)
    prev, nxt = tokens[:, :-1].ravel(), tokens[:, 1:].ravel()
    checked = 0
    for ctx in range(8):
        following = nxt[prev == ctx]
        assert set(np.unique(following)) <= set(source.successors[ctx].tolist())
        if following.size < 1000:
            continue  # a rarely visited context: too few samples to compare frequencies
        checked += 1
        for succ, p in zip(source.successors[ctx], source.probs[ctx]):
            # binomial std <= sqrt(0.25 / n); 5 sigma
            assert abs((following == succ).mean() - p) < 5 * math.sqrt(0.25 / following.size)
    assert checked >= 3
    # the first token is uniform
    first = np.bincount(tokens[:, 0], minlength=8) / 2000
    assert np.all(np.abs(first - 1 / 8) < 0.04)


def test_same_seed_same_data_other_seed_other_train_same_held_out():
    a = build_dataset(markov_cfg(), seq_len=32, seed=0)
    b = build_dataset(markov_cfg(), seq_len=32, seed=0)
    c = build_dataset(markov_cfg(), seq_len=32, seed=1)
    assert torch.equal(a.train.tokens, b.train.tokens)
    assert torch.equal(a.eval.tokens, b.eval.tokens)
    assert a.floor == b.floor
    assert not torch.equal(a.train.tokens, c.train.tokens)
    assert (a.train.tokens != c.train.tokens).float().mean() > 0.5
    assert torch.equal(a.eval.tokens, c.eval.tokens)
    assert a.floor == c.floor
    # a different transition table is a different task
    d = build_dataset(markov_cfg(table_seed=1), seq_len=32, seed=0)
    assert not torch.equal(a.eval.tokens, d.eval.tokens)
    assert d.floor != a.floor


@pytest.mark.parametrize("seed", [0, 1, 2, 5003, 5004])
def test_no_seed_trains_on_the_held_out_set(seed):
    """The training stream of any seed differs from the held-out stream (seed 5003 once drew the held-out
    set itself). A likely path can still appear in both by chance, so a few shared rows are allowed."""
    data = build_dataset(markov_cfg(train_sequences=64), seq_len=32, seed=seed)
    held = {tuple(row) for row in data.eval.tokens.tolist()}
    shared = sum(tuple(row) in held for row in data.train.tokens.tolist())
    assert shared <= 3


def id_dataset(n: int) -> Dataset:
    """Row i of the training set is [i, i, i]: a batch's rows name the examples it drew."""
    tokens = torch.arange(n).unsqueeze(1).repeat(1, 3)  # (n, 3)
    return Dataset(Split(tokens), Split(tokens[:2]), vocab_size=n, floor=math.nan)


def drawn(data: Dataset, step: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1) -> list:
    x, y = data.batch(step, batch_size, seed, rank, world_size)
    assert x.shape == y.shape == (batch_size, 2)
    return x[:, 0].tolist()


def test_batches_are_a_pure_function_of_seed_and_step():
    forward = id_dataset(100)
    in_order = [drawn(forward, s, 8, seed=3) for s in range(30)]  # crosses epochs (12 batches each)
    shuffled = id_dataset(100)
    steps = [29, 0, 17, 5, 12, 11, 3]
    for s in steps:
        assert drawn(shuffled, s, 8, seed=3) == in_order[s]
    assert drawn(id_dataset(100), 7, 8, seed=3) == in_order[7]  # a fresh object (a resumed run)
    assert drawn(forward, 0, 8, seed=4) != in_order[0]  # the seed matters
    # within an epoch no example repeats; the next epoch is a new order
    epoch0 = sum(in_order[:12], [])
    assert len(set(epoch0)) == 96
    assert in_order[12] != in_order[0]
    # inputs and targets are the same rows shifted by one
    x, y = forward.batch(0, 4, seed=0)
    full = forward.train.tokens
    rows = x[:, 0]
    assert torch.equal(x, full[rows, :-1]) and torch.equal(y, full[rows, 1:])


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_draw_disjoint_slices_of_the_global_batch(world_size):
    data = id_dataset(200)
    per_rank = 16 // world_size
    for step in (0, 1, 7, 13):
        parts = [drawn(data, step, per_rank, seed=0, rank=r, world_size=world_size) for r in range(world_size)]
        flat = sum(parts, [])
        assert len(set(flat)) == 16  # disjoint
        # together they are the batch one process draws at the same global batch size
        assert flat == drawn(data, step, 16, seed=0)


def test_batch_larger_than_the_training_set_is_refused():
    with pytest.raises(ValueError, match=r"train\.batch_size"):
        id_dataset(10).batch(0, 8, seed=0, rank=0, world_size=2)


def text_cfg(path, **changes):
    return data_settings("text", **{"seq_len": 16, "path": str(path), "train_sequences": 50, "eval_sequences": 20,
                                    **changes})


TEXT = ("The quick brown fox jumps over the lazy dog, 0123456789. " * 4 + "naïve café ünïcode ✓ 日本語\n") * 20


def test_text_source_reads_bytes(tmp_path):
    raw = TEXT.encode()  # multi-byte characters included
    file = tmp_path / "corpus.txt"
    file.write_bytes(raw)
    data = build_dataset(text_cfg(file), seq_len=16, seed=0)
    assert data.vocab_size == 256
    assert math.isnan(data.floor) and math.isnan(data.floor_standard_error)
    assert data.train.tokens.shape == (50, 17) and data.eval.tokens.shape == (20, 17)
    assert data.train.tokens.dtype == torch.int64
    assert int(data.train.tokens.max()) <= 255 and int(data.train.tokens.min()) >= 0
    assert int(data.train.tokens.max()) > 127  # the multi-byte characters are drawn as their bytes
    cut = int(len(raw) * 0.9)
    for split, lo, hi in ((data.train, 0, cut), (data.eval, cut, len(raw))):
        for row in split.tokens.tolist():
            window = bytes(row)
            assert raw.find(window, lo) != -1 and raw.find(window, lo) + len(window) <= hi  # a window of its part


def test_text_held_out_set_does_not_depend_on_the_seed(tmp_path):
    file = tmp_path / "corpus.txt"
    letters = np.random.default_rng(0).integers(ord("a"), ord("z") + 1, 3000, dtype=np.uint8)
    file.write_bytes(bytes(letters))
    a = build_dataset(text_cfg(file), seq_len=16, seed=0)
    b = build_dataset(text_cfg(file), seq_len=16, seed=1)
    assert torch.equal(a.eval.tokens, b.eval.tokens)
    assert not torch.equal(a.train.tokens, b.train.tokens)
    assert torch.equal(a.train.tokens, build_dataset(text_cfg(file), seq_len=16, seed=0).train.tokens)


# ------------------------------------------------------------------ the floor proven


def context_chain(source: MarkovSource) -> tuple[np.ndarray, np.ndarray]:
    """The chain on contexts, built densely from the table: P[c, c'] (c = the last `order` tokens read as a
    base-V number; appending s gives c' = (c * V) mod V^k + s) and h[c], the entropy of c's next token."""
    V, k = source.vocab_size, source.order
    n = V ** k
    P, h = np.zeros((n, n)), np.zeros(n)
    for c in range(n):
        for s, p in zip(source.successors[c].tolist(), source.probs[c].tolist()):
            P[c, (c * V) % n + s] += p
            h[c] -= p * math.log(p)
    return P, h


def stationary(P: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Power iteration on the lazy chain (I + P) / 2: same stationary distribution, and it converges even
    when P is periodic. From the uniform start it is the long-run context distribution of the sampled
    sequences, which start from uniform contexts (a sparse random chain need not be irreducible)."""
    pi = start
    for _ in range(100_000):
        nxt = 0.5 * (pi + pi @ P)
        if np.abs(nxt - pi).sum() < 1e-15:
            break
        pi = nxt
    assert np.abs(pi @ P - pi).sum() < 1e-12, "power iteration did not converge"
    return pi


def expected_floor(P: np.ndarray, h: np.ndarray, V: int, k: int, T: int) -> float:
    """Exact expectation of the floor of length-T sequences: targets 1..k-1 are uniform (log V), and the
    context at position t >= k has distribution uniform @ P^(t-k)."""
    mu, total = np.full(P.shape[0], 1 / P.shape[0]), (k - 1) * math.log(V)
    for _ in range(k, T + 1):
        total += mu @ h
        mu = mu @ P
    return total / T


def test_floor_approaches_the_entropy_rate_of_the_chain():
    """The floor of a long held-out sample (400 sequences x 1024 targets) against the entropy rate
    H = sum_c pi(c) h(c). Tolerance: 4 standard errors of the sample (floor_standard_error) for sampling,
    plus the start-up bias of finite sequences, computed exactly (E[floor] - H), which shrinks as 1/T."""
    T = 1024
    data = build_dataset(markov_cfg(eval_sequences=400, train_sequences=2), seq_len=T, seed=0)
    source, V, k = data.source, data.source.vocab_size, data.source.order
    P, h = context_chain(source)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    pi = stationary(P, np.full(P.shape[0], 1 / P.shape[0]))
    entropy_rate = float(pi @ h)
    se = data.floor_standard_error
    assert 0 < se < 0.005  # the sample is large enough for the comparison to mean something
    expected = expected_floor(P, h, V, k, T)
    bias = expected - entropy_rate
    assert abs(data.floor - expected) < 4 * se
    assert abs(data.floor - entropy_rate) < 4 * se + abs(bias)
    assert 0 < bias < 2 * se  # the start-up bias is small at this length
    # ... and fades as 1/T: four times longer sequences carry about a quarter of it
    assert 0.2 < (expected_floor(P, h, V, k, 4 * T) - entropy_rate) / bias < 0.3
    # the test tells the right rate from a wrong one: uniform weighting of contexts is far off
    assert abs(float(h.mean()) - data.floor) > 20 * se


class TableOracle(torch.nn.Module):
    """The best causal predictor: the true next-token distribution from the transition table, in float64.
    Targets at positions 1..k-1 (a sequence's first tokens are uniform) get the uniform distribution."""

    def __init__(self, source: MarkovSource, causal: bool = True, smoothing: float = 0.0):
        super().__init__()
        V, k = source.vocab_size, source.order
        dense = np.zeros((V ** k, V))
        for c in range(V ** k):
            dense[c, source.successors[c]] = source.probs[c]
        dense = (1 - smoothing) * dense + smoothing / V  # smoothing > 0: a slightly wrong predictor
        with np.errstate(divide="ignore"):
            self.log_table = torch.from_numpy(np.log(dense))  # (V^k, V), -inf where the table forbids
        self.V, self.k = V, k
        self.blocks = [SimpleNamespace(attn=SimpleNamespace(causal=causal))]  # evaluation reads the layers' mask
        self.head = torch.nn.Identity()  # `hidden` already gives the logits

    def hidden(self, x: torch.Tensor, visible_keys: torch.Tensor | None = None):
        """The model interface loss_generation uses. Position i reads tokens i-k+1..i only, so keys at or
        beyond a row's visible_keys never reach the positions below it: nothing to mask."""
        return self(x)[0]

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None):
        B, T = x.shape
        logits = torch.full((B, T, self.V), -math.log(self.V), dtype=torch.float64)  # (B, T, V)
        for i in range(self.k - 1, T):  # position i predicts token i + 1 from tokens i-k+1 .. i
            ctx = torch.zeros(B, dtype=torch.int64)
            for j in range(i - self.k + 1, i + 1):
                ctx = ctx * self.V + x[:, j]
            logits[:, i] = self.log_table[ctx]
        loss = None if targets is None else F.cross_entropy(logits.reshape(-1, self.V), targets.reshape(-1))
        return logits, loss


@pytest.mark.parametrize("causal", [True, False])
def test_the_true_table_scores_exactly_the_floor(causal):
    """A predictor that knows the table reaches eval/floor (to 1e-12) through the evaluation code itself;
    a non-causal one scored per prefix too. Any other predictor is above it (Gibbs' inequality)."""
    data = build_dataset(markov_cfg(), seq_len=32, seed=0)
    metrics = evaluate(TableOracle(data.source, causal), data.eval.tokens, data.floor)
    assert metrics["eval/floor"] == data.floor
    assert metrics["eval/loss_as_trained"] == pytest.approx(data.floor, rel=1e-12, abs=1e-12)
    # the generation path rounds each position's logits to float32 before its cross-entropy
    assert metrics["eval/loss_generation"] == pytest.approx(data.floor, rel=1e-12 if causal else 1e-6)
    assert abs(metrics["eval/below_floor"]) < 1e-12
    wrong = evaluate(TableOracle(data.source, causal, smoothing=0.01), data.eval.tokens, data.floor)
    assert wrong["eval/below_floor"] < -1e-4


def test_floor_standard_error_by_hand():
    nll = torch.tensor([[1.0, 3.0], [3.0, 5.0], [2.0, 2.0]], dtype=torch.float64)
    # sequence means 2, 4, 2; mean 8/3; unbiased variance ((2/3)^2 + (4/3)^2 + (2/3)^2) / 2 = 4/3
    assert floor_standard_error(Split(torch.zeros(3, 3), nll)) == pytest.approx(math.sqrt(4 / 3) / math.sqrt(3))
    assert math.isnan(floor_standard_error(Split(torch.zeros(3, 3))))  # unknown NLL
    assert math.isnan(floor_standard_error(Split(torch.zeros(1, 3), nll[:1])))  # one sequence: no spread
    data = build_dataset(markov_cfg(), seq_len=32, seed=0)
    assert data.floor_standard_error == floor_standard_error(data.eval)


def test_floor_standard_error_matches_the_spread_of_floors():
    """Over 200 independent held-out sets (64 x 64 targets), the floors spread by the standard error the
    helper reports (the spread of 200 draws is known to about 5%); the per-token formula, which ignores
    the correlation inside a sequence, is about half of it."""
    source = MarkovSource(vocab_size=16, order=2, branching=4, concentration=0.5, table_seed=0)
    floors, reported, per_token = [], [], []
    for i in range(200):
        split = source.sample(64, 64, seed=(77, i))
        floors.append(split.true_nll.mean().item())
        reported.append(floor_standard_error(split))
        per_token.append(split.true_nll.std().item() / math.sqrt(split.true_nll.numel()))
    spread = float(np.std(floors, ddof=1))
    assert 0.85 < spread / float(np.mean(reported)) < 1.15
    assert spread / float(np.mean(per_token)) > 1.5


# ------------------------------------------------------------------ decoded samples


def test_decode_turns_byte_tokens_back_into_text(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_bytes(TEXT.encode())
    data = build_dataset(text_cfg(file), seq_len=16, seed=0)
    ids = list("café ✓".encode())  # [99, 97, 102, 195, 169, 32, 226, 156, 147]
    assert ids == [99, 97, 102, 195, 169, 32, 226, 156, 147]
    assert data.decode(ids) == "café ✓"
    assert data.decode(torch.tensor([ids])) == "café ✓"  # a (1, t) generated tensor
    # a held-out window, whatever characters it cuts, decodes to the text it was cut from
    row = data.eval.tokens[0].tolist()
    assert data.decode(row) == bytes(row).decode("utf-8", errors="replace")
    # invalid UTF-8 and ids beyond the bytes become U+FFFD, never an exception
    assert data.decode([104, 105, 0xFF, 33]) == "hi\ufffd!"
    assert data.decode([195]) == "\ufffd"  # a character cut in half
    assert data.decode([104, 300, 105, -1]) == "h\ufffdi\ufffd"
    assert data.decode([]) == ""


def test_decode_is_none_without_text():
    assert build_dataset(markov_cfg(), seq_len=8, seed=0).decode([1, 2, 3]) is None


# ------------------------------------------------------------------ data errors: one line naming data.path


def one_line_config_error(cfg, seq_len: int = 16) -> str:
    return data_error_line(cfg, seq_len)


def test_text_file_that_does_not_exist(tmp_path):
    message = one_line_config_error(text_cfg(tmp_path / "nope.txt"))
    assert message == f"data.path: {str(tmp_path / 'nope.txt')!r} does not exist; data=text needs a text file"


@pytest.mark.parametrize("path", [None, "", "???"])
def test_text_path_not_given(path):
    cfg = text_cfg("x")
    cfg.path = path
    assert one_line_config_error(cfg) == "data.path must name a text file when data=text; got nothing"


def test_text_path_is_a_directory(tmp_path):
    message = one_line_config_error(text_cfg(tmp_path))
    assert message == f"data.path: {str(tmp_path)!r} is a directory; data=text needs a text file"


def test_text_file_too_small(tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_bytes(b"abc")
    message = one_line_config_error(text_cfg(tiny))
    assert message == f"data.path: {str(tiny)!r} has 3 bytes; data.seq_len=16 needs at least 36"
    tiny.write_bytes(b"a" * 36)  # the least that fits: a training and a held-out part
    check_data(text_cfg(tiny), 16)
    assert build_dataset(text_cfg(tiny), seq_len=16, seed=0).eval.tokens.shape == (20, 17)


def test_unreadable_text_file(tmp_path, monkeypatch):
    file = tmp_path / "corpus.txt"
    file.write_text(TEXT)

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(checks_module, "open", denied, raising=False)  # the module's own reads only
    message = one_line_config_error(text_cfg(file))
    assert message == f"data.path: {str(file)!r} cannot be read (permission denied)"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_unreadable_text_file_by_its_mode(tmp_path):
    file = tmp_path / "corpus.txt"
    file.write_text(TEXT)
    file.chmod(0)
    try:
        assert "cannot be read (permission denied)" in one_line_config_error(text_cfg(file))
    finally:
        file.chmod(0o600)


def with_fraction(byte: int, fraction: float, size: int = 10_000) -> bytes:
    """ASCII text of `size` bytes whose given fraction is `byte`, spread through it."""
    raw = bytearray(b"plain text line\n" * (size // 16 + 1))[:size]
    count = round(fraction * size)
    for i in np.linspace(0, size - 1, count).astype(int):
        raw[i] = byte
    return bytes(raw)


@pytest.mark.parametrize("byte,allowed", [(0, 0.01), (0xFF, 0.05)])
def test_binary_file_given_as_text(tmp_path, byte, allowed):
    """The rule: more than 1% NUL bytes, or more than 5% of bytes outside valid UTF-8, in the first 1 MiB."""
    file = tmp_path / "data.bin"
    file.write_bytes(with_fraction(byte, allowed - 0.002))  # just under the limit: still text
    check_data(text_cfg(file), 16)
    file.write_bytes(with_fraction(byte, allowed + 0.002))  # just over: binary
    message = one_line_config_error(text_cfg(file))
    assert message.startswith(f"data.path: {str(file)!r} looks binary, not text: ")
    assert "for token ids use data=tokens" in message


def test_binary_rule_reads_the_counts_right(tmp_path):
    file = tmp_path / "data.bin"
    file.write_bytes(bytes(range(256)) * 40)  # 1/256 NUL (0.4%), 128/256 bytes outside UTF-8 (50%)
    message = one_line_config_error(text_cfg(file))
    assert "0.4% NUL bytes and 50.0% bytes outside UTF-8 in its first 10240 bytes" in message
    # valid multi-byte UTF-8 is text, however many non-ASCII characters it has
    file.write_text("日本語のテキスト" * 500)
    check_data(text_cfg(file), 16)
    # only the first 1 MiB is judged
    file.write_bytes(b"a" * (1 << 20) + b"\0" * 100_000)
    check_data(text_cfg(file), 16)


def test_markov_needs_no_file():
    check_data(markov_cfg(), 16)


def test_unknown_source_is_refused():
    with pytest.raises(ValueError, match="data must be markov, text or tokens; got 'wiki'"):
        build_dataset(markov_cfg(name="wiki"), seq_len=8, seed=0)
    with pytest.raises(ConfigError, match="data must be markov, text or tokens; got 'wiki'"):
        check_data(markov_cfg(name="wiki"), 8)


def test_briefly_trained_causal_model_stays_above_the_floor(tmp_path):
    """andrea_tiny, 100 steps on the built-in chain: it learns (below log V) but no causal model
    can beat the floor on held-out data."""
    from andrea_exp.training.loop import train

    overrides = ["train.max_steps=100", "train.batch_size=16", "probe.every=0", "logger.mode=disabled",
                 "train.eval_every=0", "train.sample_tokens=4", "data.train_sequences=2000"]
    cfg = compose_config(*overrides)
    summary = train(validate(cfg), tmp_path)
    assert summary["run/status"] == "finished" and summary["run/steps"] == 100
    loss, floor = summary["eval/loss_as_trained"], summary["eval/floor"]
    data = build_dataset(cfg.data, cfg.data.seq_len, cfg.seed)
    assert floor == pytest.approx(floor_by_hand(data.source, data.eval.tokens), rel=1e-9)
    assert floor < loss < math.log(cfg.data.vocab_size)
    assert summary["eval/below_floor"] == pytest.approx(floor - loss) and summary["eval/below_floor"] < 0
    assert summary["eval/loss_generation"] == loss  # a causal model: generation sees what training saw


# ------------------------------------------------------------------ edges of the chain and of the floor's error


def test_floor_standard_error_of_two_sequences_and_of_one_target_each():
    # two sequences of one target: means 1 and 3, unbiased std sqrt(2), over sqrt(2) -> 1
    nll = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    assert floor_standard_error(Split(torch.zeros(2, 2), nll)) == pytest.approx(1.0)


def test_context_count_limit_is_two_million():
    with pytest.raises(ValueError, match=r"^data.vocab_size \*\* data.order must be at most 2,000,000 contexts; "
                                         r"got 1415\*\*2$"):
        MarkovSource(vocab_size=1415, order=2, branching=2, concentration=1.0, table_seed=0)  # 2,002,225
    with pytest.raises(ValueError, match="at most 2,000,000"):
        MarkovSource(vocab_size=2_000_001, order=1, branching=2, concentration=1.0, table_seed=0)
    source = MarkovSource(vocab_size=2_000_000, order=1, branching=2, concentration=1.0, table_seed=0)  # the limit
    assert source.successors.shape == (2_000_000, 2)


def test_every_successor_keeps_a_probability_of_at_least_about_1e6():
    """A small concentration puts almost all weight on one successor; the table keeps the others at
    1e-6 (before renormalising), so every transition it lists has a finite, bounded NLL."""
    source = MarkovSource(vocab_size=16, order=2, branching=4, concentration=0.01, table_seed=0)
    assert source.probs.min() >= 1e-6 / (1 + 4 * 1e-6)
    assert source.probs.min() < 2e-6  # the clip was needed: some weights fell below 1e-6


@pytest.mark.parametrize("order,length", [(3, 1), (3, 2), (2, 1)])
def test_sequences_shorter_than_the_order_are_uniform(order, length):
    """Fewer than `order` tokens before a target: every token is a uniform draw, NLL log V."""
    split = MarkovSource(vocab_size=5, order=order, branching=2, concentration=1.0, table_seed=0).sample(
        40, length, seed=0)
    assert split.tokens.shape == (40, length + 1)
    assert torch.all(split.true_nll == math.log(5))
    counts = torch.bincount(split.tokens.flatten(), minlength=5)
    assert counts.numel() == 5 and counts.min() > 0  # uniform over 0..V-1


def test_sampling_survives_a_cumulative_row_that_rounds_below_one():
    """A draw above the row's last cumulative value (float rounding) takes the last successor."""
    source = MarkovSource(vocab_size=6, order=1, branching=3, concentration=1.0, table_seed=0)
    source._cum = source._cum * 0.5  # every row now ends at 0.5: half the draws fall past its end
    split = source.sample(200, 4, seed=0)
    tokens = split.tokens.numpy()
    for t in range(1, 5):
        prev, nxt = tokens[:, t - 1], tokens[:, t]
        assert all(nxt[i] in source.successors[prev[i]] for i in range(200))
    # draws past the end (about half) all land on the last successor
    last = source.successors[tokens[:, 0], -1]
    assert 0.4 < float(np.mean(tokens[:, 1] == last)) < 0.9


def test_a_forbidden_transition_is_inf_without_a_warning():
    import warnings

    source = MarkovSource(vocab_size=8, order=1, branching=2, concentration=1.0, table_seed=0)
    forbidden = next(t for t in range(8) if t not in source.successors[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nll = source.nll_of(torch.tensor([[0, forbidden]]))
    assert nll.tolist() == [[math.inf]]
