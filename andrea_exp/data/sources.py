"""Data sources: a generated Markov chain with an exact entropy floor, a user's text file, a token corpus.

Markov source: each sequence starts with `order` uniform tokens, then every token follows from the
previous `order` tokens through a sparse random transition table (`branching` successors per context,
Dirichlet weights). Because the table is known, each target token has an exact true negative
log-likelihood given its causal prefix; their mean over the held-out set is the floor, the lowest
loss any causal predictor can reach on it. A loss below the floor proves the model reads the future.

Text source: a user's file read as bytes (256 tokens). Tokens source: a directory with train.bin and
val.bin, flat little-endian uint16 token ids (the format GPT-2 data-preparation scripts write), read
through a memory map so a corpus larger than memory trains without being loaded; its meta.json, when
andrea_exp.data.prepare wrote one, gives the vocabulary size (data.vocab_size null) and the tokenizer for samples.

`check_data` (in andrea_exp.config.data_checks, which needs no torch) finds a bad data.path (missing, unreadable,
a directory, binary, too small) before any expensive work and says so in one line.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from andrea_exp.config.data_checks import (
    check_data,
    check_markov_contexts,
    held_out_token_windows,
    open_tokens,
    token_meta,
    token_vocab_size,
    too_large_id,
)
from andrea_exp.data.references import NgramCounts, held_out_references, token_file_stretches

HELD_OUT_SEED = 10_007  # the held-out set's random stream, independent of the run's seed


@dataclass
class Split:
    # (N, T + 1) int64: inputs are [:, :-1], targets [:, 1:]; for data=tokens' training split, a TokenWindows
    # (the same rows, read from the file on demand)
    tokens: torch.Tensor | TokenWindows
    true_nll: torch.Tensor | None = None  # (N, T) float64: exact NLL of each target, when known


def floor_standard_error(split: Split) -> float:
    """Sampling standard error of the floor (the mean of split.true_nll); nan when the NLL is unknown.

    Tokens of one sequence are correlated (they share the chain's path) but sequences are drawn
    independently, so the error is the standard deviation of the per-sequence mean NLL over sqrt(N)
    (N sequences of equal length). This accounts for the correlation inside a sequence, which the
    per-token formula std / sqrt(N * T) would ignore.
    """
    if split.true_nll is None or split.true_nll.size(0) < 2:
        return math.nan
    per_sequence = split.true_nll.double().mean(dim=1)  # (N,)
    return float(per_sequence.std(unbiased=True) / math.sqrt(per_sequence.numel()))


class MarkovSource:
    """Order-k Markov chain over `vocab_size` tokens with `branching` successors per context."""

    def __init__(self, vocab_size: int, order: int, branching: int, concentration: float, table_seed: int):
        check_markov_contexts(vocab_size, order)  # also for a caller without a config
        self.vocab_size, self.order = vocab_size, order
        rng = np.random.default_rng(table_seed)
        n_ctx = vocab_size ** order
        branching = min(branching, vocab_size)
        # successors[c] lists the distinct tokens that may follow context c; probs[c] their probabilities
        self.successors = self._distinct_successors(rng, n_ctx, vocab_size, branching)
        self.probs = rng.dirichlet(np.full(branching, concentration), size=n_ctx)
        self.probs = np.clip(self.probs, 1e-6, None)
        self.probs /= self.probs.sum(axis=1, keepdims=True)
        self._cum = np.cumsum(self.probs, axis=1)

    @staticmethod
    def _distinct_successors(rng, n_ctx: int, vocab_size: int, branching: int) -> np.ndarray:
        """(n_ctx, branching) distinct tokens per row, in O(n_ctx * branching) for large vocabularies."""
        if 2 * branching > vocab_size:
            return np.argsort(rng.random((n_ctx, vocab_size)), axis=1)[:, :branching]
        succ = rng.integers(0, vocab_size, size=(n_ctx, branching))
        while True:  # redraw the rare rows with a repeated token
            ordered = np.sort(succ, axis=1)
            repeated = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
            if not repeated.any():
                return succ
            succ[repeated] = rng.integers(0, vocab_size, size=(int(repeated.sum()), branching))

    def _context(self, seq: np.ndarray, t: int) -> np.ndarray:
        """Context index of the `order` tokens before position t, for every row of seq."""
        ctx = np.zeros(seq.shape[0], dtype=np.int64)
        for j in range(t - self.order, t):
            ctx = ctx * self.vocab_size + seq[:, j]
        return ctx

    def sample(self, n: int, length: int, seed: int | tuple[int, ...]) -> Split:
        """n sequences of `length` + 1 tokens and the exact NLL of each of the `length` targets."""
        rng = np.random.default_rng(seed)
        seq = np.zeros((n, length + 1), dtype=np.int64)
        nll = np.zeros((n, length + 1))
        k = min(self.order, length + 1)
        seq[:, :k] = rng.integers(0, self.vocab_size, size=(n, k))
        nll[:, :k] = math.log(self.vocab_size)
        for t in range(k, length + 1):
            ctx = self._context(seq, t)
            u = rng.random(n)
            choice = (u[:, None] > self._cum[ctx]).sum(axis=1)
            choice = np.minimum(choice, self._cum.shape[1] - 1)
            seq[:, t] = self.successors[ctx, choice]
            nll[:, t] = -np.log(self.probs[ctx, choice])
        return Split(torch.from_numpy(seq), torch.from_numpy(nll[:, 1:]))

    def nll_of(self, seq: torch.Tensor) -> torch.Tensor:
        """Exact NLL of each target of given sequences (N, T+1) -> (N, T)."""
        s = seq.cpu().numpy()
        out = np.zeros(s.shape, dtype=np.float64)
        out[:, : self.order] = math.log(self.vocab_size)
        for t in range(self.order, s.shape[1]):
            ctx = self._context(s, t)
            hit = self.successors[ctx] == s[:, t, None]  # (N, branching): where the token sits among successors
            prob = np.where(hit, self.probs[ctx], 0.0).sum(axis=1)
            with np.errstate(divide="ignore"):
                out[:, t] = -np.log(prob)  # inf for a transition the table forbids
        return torch.from_numpy(out[:, 1:])


def text_splits(path: str, seq_len: int, n_train: int, n_eval: int, seed: int) -> tuple[Split, Split, np.ndarray]:
    """Byte-level windows from a user's file: the first 90% for training, the last 10% held out, and the
    training bytes themselves (the references count them). The file is one check_data accepts (at least
    2 * (seq_len + 2) bytes); it is read once."""
    raw = np.frombuffer(Path(path).expanduser().read_bytes(), dtype=np.uint8).astype(np.int64)
    cut = min(max(int(raw.size * 0.9), seq_len + 2), raw.size - (seq_len + 2))
    train_raw, eval_raw = raw[:cut], raw[cut:]

    def windows(arr, n, rng):
        starts = rng.integers(0, arr.size - seq_len, size=n)
        return torch.from_numpy(np.stack([arr[s : s + seq_len + 1] for s in starts]))

    # the held-out windows do not depend on the run's seed, so every seed is scored on the same text
    train = windows(train_raw, n_train, np.random.default_rng(seed))
    held_out = windows(eval_raw, n_eval, np.random.default_rng(HELD_OUT_SEED))
    return Split(train), Split(held_out), train_raw


def decode_bytes(ids: Sequence[int] | torch.Tensor) -> str:
    """Byte-level token ids back to text: UTF-8, with U+FFFD for an invalid sequence and for an id
    outside 0..255 (a model whose vocabulary is wider than the bytes can generate one)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.flatten().tolist()
    parts, run = [], bytearray()
    for token in ids:
        if 0 <= token < 256:
            run.append(token)
        else:
            parts += [run.decode("utf-8", errors="replace"), "\ufffd"]
            run = bytearray()
    parts.append(run.decode("utf-8", errors="replace"))
    return "".join(parts)


class TokenWindows:
    """The training windows of a flat uint16 token file, read on demand through a memory map.

    The file of L tokens holds W = (L - 1) // T windows of T + 1 tokens that do not overlap except at
    their boundary token (window w starts at w * T). `limit` keeps at most that many of them, spread
    evenly over the file; None keeps all. Indexing by a (B,) index tensor reads B windows from disk
    and returns them (B, T + 1) int64 on the device given to `to`; indices live on the CPU.
    """

    device = torch.device("cpu")  # where the batch's indices must be (Dataset.batch reads this)

    def __init__(self, file: Path, seq_len: int, vocab_size: int, limit: int | None = None):
        self.file, self.seq_len, self.vocab_size = file, seq_len, vocab_size
        self.ids = open_tokens(file)
        self.whole = (self.ids.size - 1) // seq_len
        self.n = self.whole if limit is None else min(limit, self.whole)
        self.target = torch.device("cpu")

    def __len__(self) -> int:
        return self.n

    def starts(self, index: np.ndarray) -> np.ndarray:
        """Token offset of each window index: window i of n is window i * W // n of the file."""
        return (index.astype(np.int64) * self.whole // self.n) * self.seq_len

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        starts = self.starts(index.cpu().numpy())  # (B,)
        rows = np.asarray(self.ids[starts[:, None] + np.arange(self.seq_len + 1)])  # (B, T + 1) uint16
        too_large_id(rows, self.vocab_size, self.file, "its training windows")
        return torch.from_numpy(rows.astype(np.int64)).to(self.target)

    def to(self, device) -> TokenWindows:
        self.target = torch.device(device)
        return self


def token_splits(cfg, seq_len: int) -> tuple[Split, Split]:
    """Training windows of train.bin (read per batch) and held-out windows of val.bin (read once)."""
    root, vocab = Path(str(cfg.path)).expanduser(), token_vocab_size(cfg)
    train = TokenWindows(root / "train.bin", seq_len, vocab, cfg.train_sequences)
    held_file = root / "val.bin"
    held = held_out_token_windows(held_file, seq_len, cfg.eval_sequences)
    too_large_id(held, vocab, held_file, "its held-out windows")
    return Split(train), Split(torch.from_numpy(held.astype(np.int64)))


@dataclass
class Dataset:
    train: Split
    eval: Split
    vocab_size: int
    floor: float  # mean exact NLL of the held-out targets; nan when unknown
    # unigram / bigram / log_vocab cross-entropy of the held-out targets (andrea_exp.data.references)
    references: dict[str, float] = field(default_factory=dict)
    source: MarkovSource | None = None
    decoder: Callable[[Sequence[int] | torch.Tensor], str] | None = None  # token ids -> text, when tokens are text
    _perm: tuple | None = None  # (key, permutation) of the current epoch

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str | None:
        """Generated token ids as readable text; None for a source whose tokens are not text."""
        return None if self.decoder is None else self.decoder(ids)

    @property
    def floor_standard_error(self) -> float:
        """Sampling standard error of `floor` (see floor_standard_error); nan when the floor is unknown."""
        return floor_standard_error(self.eval)

    @property
    def train_tokens(self) -> int:
        """Target tokens of the training split the batches draw from: training windows x T (data/train_tokens)."""
        windows = self.train.tokens
        seq_len = windows.seq_len if isinstance(windows, TokenWindows) else windows.size(1) - 1
        return len(windows) * seq_len

    def held_in(self) -> torch.Tensor:
        """A fixed set of training windows, as many as the held-out ones and evenly spaced over the training
        split (the same at every evaluation and for every seed's order): the training loss of eval/loss_train_split."""
        n_train, n = len(self.train.tokens), min(len(self.eval.tokens), len(self.train.tokens))
        index = torch.arange(n, dtype=torch.int64) * n_train // n
        return self.train.tokens[index.to(self.train.tokens.device)]

    def to(self, device) -> Dataset:
        """Keep the token tables on the training device so a batch costs no host-to-device copy."""
        self.train.tokens = self.train.tokens.to(device)
        self.eval.tokens = self.eval.tokens.to(device)
        return self

    def batch(self, step: int, batch_size: int, seed: int, rank: int = 0, world_size: int = 1):
        """The training batch of a step: a pure function of (seed, step), so a resumed run sees the
        same data as an unbroken one. Each epoch is a fresh permutation; ranks take disjoint slices."""
        n = len(self.train.tokens)
        global_bs = batch_size * world_size
        if global_bs > n:
            raise ValueError(f"train.batch_size ({batch_size}) x processes ({world_size}) must be at most "
                             f"the {n} training sequences (data.train_sequences)")
        per_epoch = max(1, n // global_bs)
        epoch, slot = divmod(step, per_epoch)
        if self._perm is None or self._perm[0] != (seed, epoch):
            gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            self._perm = ((seed, epoch), torch.randperm(n, generator=gen).to(self.train.tokens.device))
        perm = self._perm[1]
        start = slot * global_bs + rank * batch_size
        rows = self.train.tokens[perm[start : start + batch_size]]
        return rows[:, :-1], rows[:, 1:]


def references_of(train_sequences, held_out: torch.Tensor, vocab_size: int) -> dict[str, float]:
    """The data's reference losses on the held-out targets (see andrea_exp.data.references)."""
    counts = NgramCounts.of(train_sequences, vocab_size)
    return held_out_references(counts, held_out.cpu().numpy())


_LAST_BUILT: tuple[str, Dataset] | None = None  # this process's last dataset, as built (on the CPU)


def build_dataset(cfg, seq_len: int, seed: int) -> Dataset:
    """cfg is the `data` config group. A process keeps the last dataset it built: the cells of a sweep that share
    their data settings and seed (the default launcher trains them one after another in one process) build it
    once. Each call gets its own Dataset and Splits over the same CPU tensors, so moving one to a device
    (Dataset.to rebinds them) leaves the kept one as it was."""
    global _LAST_BUILT
    key = repr((cfg, seq_len, seed, _files_stamp(getattr(cfg, "path", None))))
    if _LAST_BUILT is None or _LAST_BUILT[0] != key:
        _LAST_BUILT = (key, _build_dataset(cfg, seq_len, seed))
    built = _LAST_BUILT[1]
    return dataclasses.replace(built, train=copy.copy(built.train), eval=copy.copy(built.eval), _perm=None)


def _files_stamp(path) -> tuple:
    """What the files under data.path are now (name, size, modification time): a dataset built from other
    contents is not the one kept."""
    if path is None:
        return ()
    root = Path(str(path)).expanduser()
    files = sorted(root.iterdir()) if root.is_dir() else [root]
    return tuple((f.name, st.st_size, st.st_mtime_ns) for f in files if f.is_file() for st in [f.stat()])


def _build_dataset(cfg, seq_len: int, seed: int) -> Dataset:
    if cfg.name == "markov":
        source = MarkovSource(cfg.vocab_size, cfg.order, cfg.branching, cfg.concentration, cfg.table_seed)
        # two seed streams that cannot meet: a pair for training, a single number for the held-out set,
        # which is the same for every run seed
        train = source.sample(cfg.train_sequences, seq_len, seed=(seed, 1))
        held_out = source.sample(cfg.eval_sequences, seq_len, seed=HELD_OUT_SEED + cfg.table_seed)
        refs = references_of(train.tokens.numpy(), held_out.tokens, cfg.vocab_size)
        return Dataset(train, held_out, cfg.vocab_size, float(held_out.true_nll.mean()), refs, source)
    check_data(cfg, seq_len)  # data.path's files, for a caller that did not validate; refuses other names
    if cfg.name == "text":
        train, held_out, train_bytes = text_splits(cfg.path, seq_len, cfg.train_sequences, cfg.eval_sequences, seed)
        refs = references_of([train_bytes], held_out.tokens, 256)
        return Dataset(train, held_out, 256, math.nan, refs, decoder=decode_bytes)
    # the training order comes from Dataset.batch (seed, step); the windows themselves do not depend on the seed
    train, held_out = token_splits(cfg, seq_len)
    vocab = token_vocab_size(cfg)
    refs = references_of(token_file_stretches(train.tokens.ids), held_out.tokens, vocab)
    return Dataset(train, held_out, vocab, math.nan, refs, decoder=token_decoder(Path(str(cfg.path)).expanduser()))


def token_decoder(root: Path) -> Callable[[Sequence[int] | torch.Tensor], str] | None:
    """The decoder of the tokenizer named in root/meta.json (andrea_exp.data.prepare): bytes, a trained BPE
    (tokenizer.json) or GPT-2's; None without meta.json or when the tokenizer's package cannot load it."""
    meta = token_meta(root)
    if meta is None:
        return None
    if (meta.get("tokenizer") or {}).get("kind") == "bytes":
        return decode_bytes
    from andrea_exp.data.prepare import text_decoder

    return text_decoder(root, meta)
